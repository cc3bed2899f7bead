// How the blocks run their projections (internal to src/model).
//
// In the bf16 flow every projection input is a bf16 value (norm outputs, projection outputs,
// activations and latents are rounded to bf16), so a BF16 or MXFP4 job takes a bf16 copy of
// its input and runs on the AVX512_BF16 dot-product kernels (matmul.h: the same exact products,
// another fixed summation order). The copy is checked to be exact; an input that is not (never
// expected in the bf16 flow) keeps the f32 kernel for the whole job.
#pragma once

#include <cstdint>

#include "io/weights.h"
#include "kernels/matmul.h"
#include "model/arena.h"
#include "model/options.h"

namespace attnres {

struct Proj {
  Arena& arena;
  bool bf16 = false;  // round outputs to bf16 (a bf16 nn.Linear output)
  bool dot = false;   // give BF16 / MXFP4 jobs exact bf16 inputs
  ProjectionStats* stats = nullptr;
};

Proj make_proj(const ForwardOptions& opt, Arena& arena);

// Runs the jobs in one parallel region, then rounds the outputs of jobs [first_rounded, n) to
// bf16 in the bf16 flow.
void project_batch(const Proj& pj, MatmulJob* jobs, int64_t n, int64_t first_rounded = 0);

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

}  // namespace attnres
