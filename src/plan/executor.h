// Executor: runs one forward step (the program of program.h) under any storage plan, with the
// same kernels for every policy, and hands the final normalised hidden state to the caller.
//
// Contract with the model (who plugs its KDA / MLA / MoE / dense sublayers in):
// - The model implements SublayerRunner. Each call writes exactly [T, d] rows into `out`
//   (row-major, row stride d, element type out.dtype). `in` and `out` MAY BE THE SAME STORAGE
//   (the plan decides); a runner must then read everything it needs from `in` (e.g. project it
//   into its own scratch) before writing `out`. A runner never keeps a pointer to `in` or `out`
//   across calls: the storage is reused for other values right after.
// - `attention(i, in, out)`: `in` is the normalised layer input input_layernorm(h_i) (the
//   executor applies the norm; it is fused with the AttnRes read), `out` receives self_attn(in).
// - `mlp(i, in, out)`: `in` is post_attention_layernorm(h), `out` receives the FFN output.
// - `embed(tokens, out)`: out[t] = embed_tokens[tokens[t]].
// - The executor owns every [T, d] activation buffer (an arena allocated once per plan and
//   capacity, bank slots included); nothing is allocated per layer or per step.
// - After run(), final_hidden() is norm(h_final) with the final norm weight, [T, d]; the caller
//   applies lm_head. It stays valid until the next run() or the executor's destruction.
// - Parameters (ForwardParams) are fp32 spans owned by the caller: the folded AttnRes queries
//   q = res_norm.weight * res_proj.weight (computed once in fp32 at load) and the RMSNorm gains
//   widened to fp32 (exact for bf16 gains). Plain-residual models leave the queries empty.
//
// Thread-safety: one run() at a time per Executor. Kernels split token rows over the
// pool's threads; the result does not depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "plan/plan.h"
#include "plan/program.h"
#include "util/numeric.h"
#include "util/status.h"

namespace attnres {

// Activation (storage) element type of a forward pass: bf16 as HF in bf16 (rounded after every
// add), or f32 (weights widened; the mode the golden data were computed with).
enum class ActDType { kBF16, kF32 };
std::string_view act_dtype_name(ActDType t);  // "bf16" | "f32"
size_t act_dtype_size(ActDType t);

// A [tokens, dim] row-major activation in bf16 or f32. Non-owning.
struct ActView {
  void* data = nullptr;
  ActDType dtype = ActDType::kBF16;
  int64_t tokens = 0;
  int64_t dim = 0;

  int64_t numel() const { return tokens * dim; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * act_dtype_size(dtype); }
  bf16* bf16_data() const { return static_cast<bf16*>(data); }
  float* f32_data() const { return static_cast<float*>(data); }
  // Element i widened to f32.
  float get(int64_t i) const {
    return dtype == ActDType::kBF16 ? bf16_to_f32(bf16_data()[i]) : f32_data()[i];
  }
};

class SublayerRunner {
 public:
  virtual ~SublayerRunner() = default;
  virtual Status embed(std::span<const int32_t> tokens, const ActView& out) = 0;
  virtual Status attention(int layer, const ActView& in, const ActView& out) = 0;
  virtual Status mlp(int layer, const ActView& in, const ActView& out) = 0;
};

// Per-layer parameters the executor itself needs (everything else belongs to the runner).
struct LayerResParams {
  std::span<const float> attn_query;  // [d] folded pre-attention query; empty at layer 0 / plain
  std::span<const float> mlp_query;   // [d] folded pre-MLP query; empty for plain residual
  std::span<const float> input_layernorm;           // [d] gain of the attention-input norm
  std::span<const float> post_attention_layernorm;  // [d] gain of the MLP-input norm
};

struct ForwardParams {
  float res_eps = 0;   // eps of the AttnRes source RMS (config rms_norm_eps)
  float norm_eps = 0;  // eps of input/post-attention/final RMSNorm (config rms_norm_eps)
  std::vector<LayerResParams> layers;   // one per decoder layer
  std::span<const float> output_query;  // [d] folded final-read query; empty for plain residual
  std::span<const float> final_norm;    // [d] gain of model.norm
};

// Which implementation of the AttnRes step to use: the fused kernel (production) or the scalar
// reference (tests and golden comparisons).
enum class ReadKernel { kFused, kReference };

struct ExecutorOptions {
  ActDType dtype = ActDType::kBF16;
  int64_t max_tokens = 0;  // capacity T of every buffer
  int64_t dim = 0;         // hidden size d
  ReadKernel kernel = ReadKernel::kFused;
  // A plan with verifier findings is refused (kHazard) unless this is set. Only the lifetime
  // harness sets it, to demonstrate what the hazard does.
  bool allow_hazards = false;
  // Keep one more [max_tokens, d] buffer for the raw (pre-norm) mixture of every read and hand
  // it to the StepObserver after each read step (value -1). For golden comparisons.
  bool capture_raw_mixture = false;
};

// Called after every step with the values that step defined and the storage now holding each
// (e.g. to dump intermediates for golden comparisons), and, with capture_raw_mixture, after
// each read step with value -1 and the read's raw mixture. Views are valid only during the call.
using StepObserver = std::function<void(const Step& step, int value, const ActView& view)>;

class Executor {
 public:
  // Verifies the plan against the program and allocates the arena (one [max_tokens, dim]
  // buffer per plan storage, plus the per-slot inverse RMS [bank_slots, max_tokens] fp32).
  static Result<std::unique_ptr<Executor>> create(Program program, Plan plan,
                                                  const ExecutorOptions& options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // One forward step over tokens.size() <= max_tokens rows.
  Status run(SublayerRunner& runner, const ForwardParams& params, std::span<const int32_t> tokens,
             const StepObserver& observer = nullptr);

  // Valid after run(): the final normalised hidden state [T, d].
  ActView final_hidden() const;
  // The storage currently assigned to a value, viewed with the last run's T (its content is
  // that value's only while the plan keeps it there; bank slots keep theirs to the end).
  ActView value_view(int value) const;
  ActView storage_view(int storage) const;

  const Program& program() const { return program_; }
  const Plan& plan() const { return plan_; }
  const ExecutorOptions& options() const { return options_; }
  size_t arena_bytes() const;
  // Wall time spent in AttnRes read steps (fused or reference kernel) since creation: what
  // `attnres bench` reports as the AttnRes share of decode time.
  double read_seconds() const { return read_seconds_; }

 private:
  double read_seconds_ = 0;
  Executor(Program program, Plan plan, const ExecutorOptions& options);
  Status check_params(const ForwardParams& params) const;
  Status run_read(const Step& step, const ForwardParams& params, int64_t T);
  ActView raw_mixture_view() const;

  Program program_;
  Plan plan_;
  ExecutorOptions options_;
  struct Arena;
  std::unique_ptr<Arena> arena_;
  int64_t last_tokens_ = 0;
};

}  // namespace attnres
