// How the blocks run their projections (internal to src/model).
//
// In the bf16 flow every projection input is a bf16 value (norm outputs, projection outputs,
// activations and latents are rounded to bf16), so a BF16 or MXFP4 job takes a bf16 copy of
// its input and runs on the AVX512_BF16 dot-product kernels (matmul.h: the same exact products,
// another fixed summation order). The copy is checked to be exact; an input that is not (never
// expected in the bf16 flow) keeps the f32 kernel for the whole job.
#pragma once

#include <cstdint>

#include <initializer_list>

#include "io/weights.h"
#include "kernels/matmul.h"
#include "model/arena.h"
#include "model/options.h"
#include "parallel/gather.h"
#include "util/parallel.h"

namespace attnres {

struct Proj {
  Arena& arena;
  bool bf16 = false;  // round outputs to bf16 (a bf16 nn.Linear output)
  bool dot = false;   // give BF16 / MXFP4 jobs exact bf16 inputs
  ProjectionStats* stats = nullptr;
  // A block's input and, when the caller has them, the same values as bf16: jobs reading
  // `input` take input_h as their bf16 tokens instead of a copy (prepare_batch).
  const float* input = nullptr;
  const attnres::bf16* input_h = nullptr;  // (the member bf16 hides the type name)
};

Proj make_proj(const ForwardOptions& opt, Arena& arena, const float* input = nullptr,
               const bf16* input_h = nullptr);

// Runs the jobs in one parallel region; in the bf16 flow the outputs of jobs [first_rounded, n)
// are rounded to bf16 (MatmulJob::round_bf16: by the threads that computed them).
void project_batch(const Proj& pj, MatmulJob* jobs, int64_t n, int64_t first_rounded = 0);
// project_batch with `side`, work that neither reads nor writes the jobs' inputs and outputs,
// in the same region: `side` is one task and the jobs' rows, in parts of about 32 KiB of
// weights (whole row groups), are the others, so the threads share the jobs and the one that
// runs `side` joins them when it is done. For a decode step's small batch beside small serial
// work (KDA's convolutions beside f_b_proj). The stats take the region's time. Dense jobs only.
void project_batch_beside(const Proj& pj, MatmulJob* jobs, int64_t n, CallRef<> side);

// y [T, N] = x [T, K] W^T, rounded to bf16 in the bf16 flow (a bf16 nn.Linear output).
void project(const Proj& pj, const float* x, int64_t T, const Matrix& W, float* y);

MatmulJob expert_job(const float* x, int64_t T, const ExpertMatrix& m, float* y);

// A small F32/BF16 tensor (conv weights, biases, gains) as f32 values: F32 data is used in place
// when it is 4-byte aligned (safetensors does not promise alignment), anything else is widened
// into arena memory.
const float* widen(const TensorView& t, Arena& arena);

// out = act(gate, up) elementwise (SiTU or SiLU per the config), rounded to bf16 when asked.
void gated_activation(const ModelConfig& c, const float* gate, const float* up, int64_t n,
                      bool bf16_out, float* out);
// The same rounded to bf16 and stored as bf16 (a projection's bf16 tokens).
void gated_activation(const ModelConfig& c, const float* gate, const float* up, int64_t n,
                      bf16* out);

}  // namespace attnres

namespace attnres {

// Tensor parallelism inside the blocks (../shared/docs/parallel.md). A sharded projection
// computes this rank's output rows (its weight view holds only them) straight into its columns
// of the whole [T, N] result (MatmulJob::ldy), then the ranks all-gather the result; a head-split
// core runs on this rank's heads and gathers its outputs the same way. With one rank the shard
// is everything and every gather is a no-op.
struct TpStep {
  TensorParallel* tp = nullptr;  // null: one rank
  Shard shard;

  bool sharded() const { return shard.ranks > 1; }
  Range range(int64_t n) const { return shard.range(n); }
  // Fused all-gather of parts that are ready together (one collective).
  void gather(std::initializer_list<GatherPart> parts) const;
  // The same, started; finish() completes it (independent work may run in between).
  void start(std::initializer_list<GatherPart> parts) const;
  void finish() const;
};

TpStep tp_step(const ForwardOptions& opt);

// A job over this rank's rows of W (the view holds exactly them) writing its [T, rows] output
// into columns [col0, col0 + rows) of y [T, ld].
MatmulJob cols_job(const float* x, int64_t T, const Matrix& W, float* y, int64_t col0, int64_t ld);
MatmulJob expert_cols_job(const float* x, int64_t T, const ExpertMatrix& m, float* y, int64_t col0,
                          int64_t ld);

// A gather part: y [rows, units * unit] (row stride ld, 0 = its width), this rank's columns in
// place; `bf16` when every value is a bf16 value (rounded in the bf16 flow).
inline GatherPart part(float* y, int64_t rows, int64_t units, int64_t unit, bool bf16,
                       int64_t ld = 0) {
  GatherPart p;
  p.full = y;
  p.rows = rows;
  p.units = units;
  p.unit = unit;
  p.ld = ld;
  p.bf16 = bf16;
  return p;
}
// The same with this rank's columns in a separate contiguous buffer `local`.
inline GatherPart part_from(const float* local, float* y, int64_t rows, int64_t units, int64_t unit,
                            bool bf16) {
  GatherPart p = part(y, rows, units, unit, bf16);
  p.local = local;
  return p;
}

}  // namespace attnres
