// Lane-packed BF16 projections: y = x W^T over BF16 weights stored so that one vector lane is
// one output row (the layout: util/lanes.h). The model's dense projections are stored this way
// (io/weights.h); matmul.h's batches run them as WeightKind::kBF16Lanes jobs.
//
// With vdpbf16ps, lane j of a group's vector v takes row 16v + j, and one instruction multiplies
// 16 rows by a broadcast pair of a token's values. No lane ever needs a horizontal sum, so a tile
// of 6 tokens x 64 rows runs its 24 accumulators over the whole K with 4 weight loads and 6
// broadcasts per 24 vdpbf16ps, and a decode GEMV reads each group as one sequential stream.
//
// Numerics: y[t][n] is one accumulator, starting at +0, that takes the pairs q = 0, 1, ...,
// K/2 - 1 in order, each as acc = fma(x[2q], w[2q], fma(x[2q+1], w[2q+1], acc)). For bf16 tokens
// a product is exact, so each step is vdpbf16ps's (acc + odd product) + even product with two
// roundings, and every target gives the same bits. That order depends only on K: the bits do not
// depend on T, on where the row falls in a group, on the row range a call covers or on the thread
// count, and the scalar twins (`_ref`) give the same bits. An f32 x whose values are all bf16
// values gives the bits of the bf16 x. Other f32 tokens give the twin's bits on targets with FMA
// (AVX2, AVX-512); SSE4 and older round the product first. vdpbf16ps treats subnormal bf16 inputs
// and results as zero; the twins and the other paths keep them, so only data with subnormal
// values or partial sums can differ between CPUs.
#pragma once

#include <cstdint>

#include "util/lanes.h"
#include "util/numeric.h"

namespace attnres {

// y [T, N] (row stride ldy) = x [T, K] W^T for rows [row0, row0 + rows) of the packed W [N, K]:
// writes y[t][n - row0] for n in that range. Runs on the calling thread and the pool's workers
// when the product is large enough; K must be even, row0 + rows <= N.
void matmul_bf16_lanes(const bf16* x, int64_t T, const bf16* packed, int64_t N, int64_t K,
                       int64_t row0, int64_t rows, float* y, int64_t ldy);
// The same with f32 tokens (see Numerics).
void matmul_lanes(const float* x, int64_t T, const bf16* packed, int64_t N, int64_t K, int64_t row0,
                  int64_t rows, float* y, int64_t ldy);
// The same on the calling thread only, for a batch's work unit: xh (bf16) when the job has it,
// else x (f32); row0 a multiple of 64. round_bf16: each output is rounded to the nearest bf16
// value (round_bf16, kept in f32) as its tile stores it (a bf16 nn.Linear output), the bits of
// the unrounded call's outputs through round_bf16.
void matmul_lanes_rows(const bf16* xh, const float* x, int64_t T, const bf16* packed, int64_t N,
                       int64_t K, int64_t row0, int64_t rows, float* y, int64_t ldy,
                       bool round_bf16);

// One pair's step in a lane, as the scalar twins (and mxfp4_lanes_ref) take it: a fused
// multiply-add of the odd element, then of the even one.
float lane_pair_step(float acc, float x_odd, float w_odd, float x_even, float w_even);

// Scalar twins: the same arithmetic in the same order, one output at a time.
void matmul_bf16_lanes_ref(const bf16* x, int64_t T, const bf16* packed, int64_t N, int64_t K,
                           int64_t row0, int64_t rows, float* y, int64_t ldy);
void matmul_lanes_ref(const float* x, int64_t T, const bf16* packed, int64_t N, int64_t K,
                      int64_t row0, int64_t rows, float* y, int64_t ldy);

}  // namespace attnres
