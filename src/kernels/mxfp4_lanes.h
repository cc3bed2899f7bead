// MXFP4 projections over the 16-row lane layout (util/mxfp4_lanes.h): y = x W^T with one output
// row per vector lane, so no lane ever needs a horizontal sum.
//
// Numerics: y[t][n] is one f32 accumulator, starting at +0. Each 32-element block b of the row,
// in order, is first summed alone: a block sum s starts at +0 and takes the block's pairs q in
// order, each as s = fma(x[2q], w[2q], fma(x[2q + 1], w[2q + 1], s)) with w the elements' E2M1
// values, unscaled (exact in bf16 and f32); then acc = fma(s, 2^(e_b - 127), acc) with e_b the
// block's E8M0 byte (255: NaN; 0: 2^-127, an f32 subnormal). For bf16 tokens every product is
// exact, so a pair's step is vdpbf16ps's (acc + odd product) + even product with two roundings,
// and the power of two is an exact factor: the block's products are summed at the weights' own
// scale and the scale costs one rounding per block. That order depends only on K: the bits do
// not depend on T, on the tile a row falls in, on the row range a call covers or on the thread
// count, and the scalar twin gives the same bits. vdpbf16ps treats subnormal bf16 inputs and
// results as zero; the twin and the generic kernels keep them, so only data with subnormal
// token values or block partial sums can differ between CPUs. Targets without FMA (SSE4 and
// older) round a scaled block sum that is subnormal (scale bytes 0 and 1) twice. f32 tokens
// follow the same order with f32 products (the twin's bits on targets with FMA).
#pragma once

#include <cstdint>

#include "util/mxfp4_lanes.h"
#include "util/numeric.h"

namespace attnres {

// What a call may assume about W, and what it does to the outputs besides computing them.
struct Mxfp4RowsOptions {
  // No scale byte of the rows is 0 or 255 (mxfp4_scales_normal, found once where the weights
  // are loaded), so the tiles take each block's factor without the special cases. False is
  // always correct; the bits are the same either way.
  bool normal_scales = false;
  // Each output rounded to the nearest bf16 value (round_bf16, kept in f32) as its tile stores
  // it (a bf16 nn.Linear output): the unrounded call's bits through round_bf16.
  bool round_bf16 = false;
};

// y [T, rows] (row stride ldy) = x W^T for rows [row0, row0 + rows) of the MXFP4 W [N, K] in
// the lane layout (codes, scales): writes y[t][n - row0]. row0 and rows are multiples of 16.
// Tokens: xh (bf16) when given, else x (f32). Runs on the calling thread.
void mxfp4_lanes_rows(const bf16* xh, const float* x, int64_t T, const uint8_t* codes,
                      const uint8_t* scales, int64_t N, int64_t K, int64_t row0, int64_t rows,
                      float* y, int64_t ldy, Mxfp4RowsOptions opt = {});

// The same products with W in row-major codes [N, K/2] and scales [N, K/32] (any N, any row
// range; K % 32 == 0), as a memory mapping or a shape off the 16-row groups holds them: each
// call packs up to 128 rows at a time into the lane layout in a buffer of the calling thread
// and runs mxfp4_lanes_rows's tiles over them, so every output has the bits mxfp4_lanes_rows
// gives it (and the twin's); round_bf16 as in Mxfp4RowsOptions.
void mxfp4_lanes_rows_row_major(const bf16* xh, const float* x, int64_t T, const uint8_t* codes,
                                const uint8_t* scales, int64_t N, int64_t K, int64_t row0,
                                int64_t rows, float* y, int64_t ldy, bool round_bf16 = false);

// Scalar twin: the same arithmetic in the same order, one output at a time.
void mxfp4_lanes_ref(const bf16* xh, const float* x, int64_t T, const uint8_t* codes,
                     const uint8_t* scales, int64_t N, int64_t K, int64_t row0, int64_t rows,
                     float* y, int64_t ldy);

}  // namespace attnres
