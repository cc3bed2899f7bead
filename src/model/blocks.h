// The model's sublayers over normalised inputs: KDA and MLA attention, the latent MoE and the
// dense SiTU MLP. Each reads x [T, d] (every row of one forward step, model/batch.h) and
// writes out [T, d]; `out` may alias `x` (every input is consumed into arena scratch before
// `out` is written). Projections go through matmul_batch(); routed experts are computed
// straight from the MXFP4 nibbles.
//
// Rows and segments: everything row-wise (projections, norms, gates, router, experts) runs
// over all T rows at once; the attention cores run per segment against that segment's own
// sequence state (KDA: conv window and recurrent state; MLA: latent cache), in the form the
// segment's length selects (one token: recurrent / absorbed; more: chunked / expanded).
// Before an MLA block runs, every segment's cache must have room reserved for its rows
// (SequenceCache::reserve); the block writes the segment's latents at positions
// state->position .. + rows - 1 and attends over positions [0, state->position + rows).
// States advance their `position` after the whole step (the caller's job).
//
// Semantics: ../shared/docs/k3-model.md sections 3-5 and the golden READMEs; dtype flow per
// ForwardOptions (options.h). Scratch comes from `arena` (released by the caller).
#pragma once

#include <cstdint>

#include "io/weights.h"
#include "model/arena.h"
#include "model/batch.h"
#include "model/options.h"

namespace attnres {

// Each block reads x [T, d] (xh: the same values as bf16, or null) and writes out [T, d], which
// may alias x.
void kda_block(const ModelConfig& c, const KdaWeights& w, int layer, Segments segments,
               const float* x, const bf16* xh, int64_t T, const ForwardOptions& opt, Arena& arena,
               float* out);

void mla_block(const ModelConfig& c, const MlaWeights& w, int layer, Segments segments,
               const float* x, const bf16* xh, int64_t T, const ForwardOptions& opt, Arena& arena,
               float* out);

void moe_block(const ModelConfig& c, const MoeWeights& w, const float* x, const bf16* xh, int64_t T,
               const ForwardOptions& opt, Arena& arena, float* out);

void dense_mlp_block(const ModelConfig& c, const DenseMlpWeights& w, const float* x, const bf16* xh,
                     int64_t T, const ForwardOptions& opt, Arena& arena, float* out);

// y [T, N] = x [T, K] W^T as a linear layer of the flow `opt` (the blocks' projections): in the
// bf16 flow the output is rounded to bf16, and a BF16 W runs on bf16 dot products when the input
// is exactly bf16 (scratch from arena).
void linear(const ForwardOptions& opt, Arena& arena, const float* x, int64_t T, const Matrix& W,
            float* y);

}  // namespace attnres
