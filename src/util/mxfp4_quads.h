// The row-quad layout of an MXFP4 matrix's packed codes [N, K/2] (N % 4 == 0, K % 64 == 0), in
// which the rows a decode tile reads together lie together (TensorView::layout marks a view of
// it; the E8M0 scales stay row-major).
//
// Rows are stored in quads: quad g holds rows 4g .. 4g + 3 in the bytes [4g R, 4(g + 1) R), R =
// K / 2 the bytes of a row. Within a quad, for each pair p of 32-element blocks in order, the
// four rows' 32 bytes of that pair side by side: byte i of row n's pair p lies at
// 4gR + 128p + 32(n mod 4) + i. So a 4-row tile that takes a pair of blocks of its rows per step
// reads one sequential stream, where the row-major layout has it read four streams R bytes
// apart (standalone, cold experts on two threads: 0.81-0.96 of a read pass of the same bytes
// against 0.64-0.72; docs/performance.md). Every row's pair is still 32 contiguous bytes, so the
// kernels decode it as before and compute the same bits.
#pragma once

#include <cstdint>

#include "util/numeric.h"

namespace attnres {

inline constexpr int64_t kMxfp4QuadRows = 4;
inline constexpr int64_t kMxfp4QuadPairBytes = kMxfp4QuadRows * 32;  // a pair of blocks of a quad

// Whether an [N, K] matrix can be stored in row quads.
inline bool mxfp4_quads_fit(int64_t N, int64_t K) {
  return N % kMxfp4QuadRows == 0 && K % (2 * kMxfp4BlockSize) == 0;
}

// Offset of row n's first byte (its pair 0); the row's pair p lies kMxfp4QuadPairBytes * p on.
inline int64_t mxfp4_quads_row_offset(int64_t n, int64_t K) {
  static_assert(kMxfp4QuadRows == 4);
  return (n & ~int64_t{3}) * (K / 2) + (n & 3) * 32;
}

// Offset of the byte holding element k of row n (its low nibble when k is even).
inline int64_t mxfp4_quads_byte(int64_t n, int64_t k, int64_t K) {
  return mxfp4_quads_row_offset(n, K) + (k / 64) * kMxfp4QuadPairBytes + (k % 64) / 2;
}

// Element (n, k) of an MXFP4 matrix [N, K] whose codes lie in row quads (scales row-major).
inline float mxfp4_quads_get(const uint8_t* packed, const uint8_t* scale, int64_t n, int64_t k,
                             int64_t K) {
  return mxfp4_value(packed[mxfp4_quads_byte(n, k, K)], k,
                     scale[n * (K / kMxfp4BlockSize) + k / kMxfp4BlockSize]);
}

// Quad g: `rows` holds its 4 rows row-major (4 K/2 bytes); writes them in the layout above at
// out + 4 g K/2 (out is the whole packed matrix).
void pack_mxfp4_quad(const uint8_t* rows, int64_t g, int64_t K, uint8_t* out);
// packed [N, K/2] row-major -> out in row quads (mxfp4_quads_fit(N, K)).
void pack_mxfp4_quads(const uint8_t* packed, int64_t N, int64_t K, uint8_t* out);
// The same in place: each quad's storage is the bytes its rows held.
void pack_mxfp4_quads_in_place(uint8_t* codes, int64_t N, int64_t K);

}  // namespace attnres
