// The lifetime harness: runs one forward program under every storage policy with the same
// deterministic stand-in sublayers and the same fused kernels, and compares every policy's
// final output and bank bitwise against `separate` (attnres-storage.md; issue 3 part 4).
//
// Stand-in sublayers (StandInRunner): deterministic, layer-dependent, nonlinear and cheap, so
// the AttnRes traffic dominates. Each is row-local and elementwise:
//   attention(i): out = T(a_i * x + b_i * clamp(x, -1, 1) + c_i[j])
//   mlp(i):       out = T(x * (e_i + f_i * clamp(x, -1, 1)) + g_i[j])
// with per-layer scalars and per-layer [d] offsets drawn from a fixed-seed generator; `in` may
// alias `out` (each column is read before it is written). The embedding is a hash of (token,
// column) in [-1, 1). Queries and norm gains are also fixed-seed random.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "plan/executor.h"
#include "plan/plan.h"
#include "util/status.h"

namespace attnres {

struct HarnessOptions {
  int layers = 93;
  int block = 12;  // 0 = plain residual
  int64_t tokens = 4096;
  int64_t hidden = 7168;
  int reps = 3;
  ActDType dtype = ActDType::kBF16;
  uint64_t seed = 0x5eed;
};

struct HarnessPolicyResult {
  std::vector<int64_t> output_mismatches;  // per rep, vs separate (separate: vs its rep 0)
  std::vector<int64_t> bank_mismatches;    // per rep
  std::vector<Hazard> hazards;
  std::vector<double> seconds_per_rep;  // wall time of the forward pass
  double seconds = 0;                   // total over reps
  int buffers = 0;                      // storages of the plan
  size_t peak_bytes = 0;                // arena bytes (all [T, d] storages + inverse RMS)
  size_t rss_peak_bytes = 0;            // measured peak resident set during this policy's runs
};

struct HarnessResult {
  HarnessOptions options;
  int64_t output_elements = 0;  // T x d
  int64_t bank_elements = 0;    // slots x T x d
  int lower_bound_buffers = 0;
  std::map<Policy, HarnessPolicyResult> policies;
  std::vector<std::string> failures;  // unmet expectations, empty when ok
  std::string kernel_target;
  bool ok() const { return failures.empty(); }
};

// Runs every policy `reps` times. Expectations (each failure is listed in `failures`):
// planned and preserve-final: no verifier finding and bitwise equal to separate (final output
// and every bank slot); separate: no finding and identical across reps; unrestricted: at least
// one finding and a changed final output. Errors (allocation, bad options) are a Status.
// Options are checked first (check_harness_options); running out of memory is a kInternal
// Status, not an exception.
Result<HarnessResult> run_harness(const HarnessOptions& options);

// The options mirror the `attnres harness` flags and are named by them in messages: layers
// and block within a config's bounds (config/config.h) and with at most kMaxAttnResSources
// sources per read, tokens in 1..INT32_MAX, hidden in 1..kMaxConfigWidth, reps >= 1.
// kInvalidArgument listing every problem.
Status check_harness_options(const HarnessOptions& options);

// Deterministic stand-in parameters and sublayers (exposed for tests).
class StandInModel : public SublayerRunner {
 public:
  StandInModel(int layers, bool attnres, int64_t dim, uint64_t seed);
  Status embed(std::span<const int32_t> tokens, const ActView& out) override;
  Status attention(int layer, const ActView& in, const ActView& out) override;
  Status mlp(int layer, const ActView& in, const ActView& out) override;
  const ForwardParams& params() const { return params_; }

 private:
  struct Sub {
    float a = 0, b = 0;
    std::vector<float> offset;  // [d]
  };
  int64_t dim_;
  std::vector<Sub> attn_, mlp_;
  std::vector<std::vector<float>> vectors_;  // storage behind params_ spans
  ForwardParams params_;
};

}  // namespace attnres
