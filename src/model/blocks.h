// The model's sublayers over normalised inputs: KDA and MLA attention, the latent MoE and the
// dense SiTU MLP. Each reads x [T, d] and writes out [T, d]; `out` may alias `x` (every input
// is consumed into arena scratch before `out` is written). Projections go through matmul() /
// mxfp4_matmul(); routed experts are computed straight from the MXFP4 nibbles.
//
// Semantics: ../shared/docs/k3-model.md sections 3-5 and the golden READMEs; dtype flow per
// ForwardOptions (options.h). Scratch comes from `arena` (released by the caller).
#pragma once

#include <cstdint>

#include "io/weights.h"
#include "model/arena.h"
#include "model/options.h"
#include "model/state.h"

namespace attnres {

void kda_block(const ModelConfig& c, const KdaWeights& w, const float* x, int64_t T,
               KdaState& state, const ForwardOptions& opt, Arena& arena, float* out);

// Appends the T tokens' latents to `cache` (which must hold exactly the tokens before them)
// and attends over the whole cache causally.
void mla_block(const ModelConfig& c, const MlaWeights& w, const float* x, int64_t T,
               LatentCache& cache, const ForwardOptions& opt, Arena& arena, float* out);

void moe_block(const ModelConfig& c, const MoeWeights& w, const float* x, int64_t T,
               const ForwardOptions& opt, Arena& arena, float* out);

void dense_mlp_block(const ModelConfig& c, const DenseMlpWeights& w, const float* x, int64_t T,
                     const ForwardOptions& opt, Arena& arena, float* out);

// y [T, N] = x [T, K] W^T as a linear layer of the flow `opt` (the blocks' projections): in the
// bf16 flow the output is rounded to bf16, and a BF16 W runs on bf16 dot products when the input
// is exactly bf16 (scratch from arena).
void linear(const ForwardOptions& opt, Arena& arena, const float* x, int64_t T, const Matrix& W,
            float* y);

}  // namespace attnres
