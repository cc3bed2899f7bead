// Lane-packed BF16 projections: y = x W^T with bf16 tokens over BF16 weights stored so that one
// vector lane is one output row.
//
// Layout: W [N, K] (K even) is stored as G = ceil(N / 64) groups of 64 rows; group g holds, for
// each pair q of columns in order, the 64 rows' pairs (W[64g + j][2q], W[64g + j][2q + 1]),
// j = 0..63, i.e. element [g][q][j][e] = W[64g + j][2q + e], 64 * K values per group. Rows past N
// are zero. A pair q of 64 rows is four 64-byte vectors: with vdpbf16ps, lane j of vector v takes
// row 64g + 16v + j, and one instruction multiplies 16 rows by a broadcast pair of a token's
// values. No lane ever needs a horizontal sum, so a tile of 6 tokens x 64 rows runs its 24
// accumulators over the whole K with 4 weight loads and 6 broadcasts per 24 vdpbf16ps, and a
// decode GEMV reads each group as one sequential stream.
//
// Numerics: y[t][n] is one accumulator, starting at +0, that takes the pairs q = 0, 1, ...,
// K/2 - 1 in order, each as acc = (acc + x[2q+1] w[2q+1]) + x[2q] w[2q] (vdpbf16ps's order; a
// bf16 x bf16 product is exact in f32, so each step is two rounded f32 additions). That order
// depends only on K: the bits do not depend on T, on where the row falls in a group, on the row
// range a call covers or on the thread count, and the scalar twin (`_ref`) gives the same bits.
// vdpbf16ps treats subnormal bf16 inputs and results as zero; the twin and the non-AVX512_BF16
// paths keep them, so only data with subnormal values or partial sums can differ between CPUs.
#pragma once

#include <cstdint>

#include "util/numeric.h"

namespace attnres {

inline constexpr int64_t kLaneGroupRows = 64;

// Values of the packed form of an [N, K] matrix (zero-padded to whole groups).
inline int64_t bf16_lanes_size(int64_t N, int64_t K) {
  return (N + kLaneGroupRows - 1) / kLaneGroupRows * kLaneGroupRows * K;
}

// w [N, K] row-major -> out [bf16_lanes_size(N, K)] in the layout above. K must be even.
void pack_bf16_lanes(const bf16* w, int64_t N, int64_t K, bf16* out);

// y [T, N] (row stride ldy >= N) = x [T, K] W^T for rows [row0, row0 + rows) of the packed W
// [N, K]: writes y[t][n - row0] for n in that range. Runs on the calling thread and the pool's
// workers when the product is large enough; K must be even, row0 + rows <= N.
void matmul_bf16_lanes(const bf16* x, int64_t T, const bf16* packed, int64_t N, int64_t K,
                       int64_t row0, int64_t rows, float* y, int64_t ldy);
// Scalar twin: the same arithmetic in the same order, one output at a time.
void matmul_bf16_lanes_ref(const bf16* x, int64_t T, const bf16* packed, int64_t N, int64_t K,
                           int64_t row0, int64_t rows, float* y, int64_t ldy);

}  // namespace attnres
