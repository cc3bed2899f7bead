// The 16-row lane layout of an MXFP4 matrix W [N, K] (N % 16 == 0, K % 32 == 0), in which one
// vector lane holds one output row (kernels/mxfp4_lanes.h computes with it), as util/lanes.h
// does for BF16 weights.
//
// Rows are stored in groups of 16: group g holds rows 16g .. 16g + 15 in 16 K/2 code bytes and
// 16 K/32 scale bytes.
//
// Codes: the group's elements in runs of eight (a quad: the pairs 4u .. 4u + 3), 64 bytes a
// quad, read as 32 little-endian 16-bit words. Word 2r + e (r: the row in the group; e: 0 for the
// even element of a pair, 1 for the odd one) holds in its nibble s (bits 4s .. 4s + 3) the code
// of row r's element 8u + 2s + e. So one 64-byte load gives each 32-bit lane (a row) its four
// even codes in the low word and its four odd codes in the high word; shifting the words right
// by 4 puts the next pair's codes in their low nibbles, and a 32-entry word permute of the low
// five bits turns them into the pair's 32 bf16 weights: per pair of a group one shift and one
// permute, with no widening.
//
// Scales: for each 32-element block b, the 16 rows' E8M0 bytes side by side, at
// (g K/32 + b) 16 + n mod 16: a block's 16 scales are one 16-byte load.
#pragma once

#include <cstdint>

#include "util/numeric.h"

namespace attnres {

inline constexpr int64_t kMxfp4LaneRows = 16;
inline constexpr int64_t kMxfp4QuadBytes = 64;  // a group's codes of 8 elements

// Whether an [N, K] matrix can be stored in this layout.
inline bool mxfp4_lanes_fit(int64_t N, int64_t K) {
  return N % kMxfp4LaneRows == 0 && K % kMxfp4BlockSize == 0;
}

// Where element (n, k)'s code lies: nibble index i, in byte i / 2 (its high nibble if i is odd).
inline int64_t mxfp4_lanes_nibble(int64_t n, int64_t k, int64_t K) {
  const int64_t group = n / kMxfp4LaneRows, r = n % kMxfp4LaneRows;
  const int64_t quad = k / 8, s = (k % 8) / 2, e = k % 2;
  const int64_t byte =
      group * kMxfp4LaneRows * (K / 2) + quad * kMxfp4QuadBytes + 2 * (2 * r + e) + s / 2;
  return 2 * byte + s % 2;
}

// Element (n, k)'s E2M1 code (0..15).
inline uint8_t mxfp4_lanes_code(const uint8_t* codes, int64_t n, int64_t k, int64_t K) {
  const int64_t i = mxfp4_lanes_nibble(n, k, K);
  return static_cast<uint8_t>((codes[i / 2] >> (4 * (i % 2))) & 0x0f);
}

// Offset of row n's scale byte of block b.
inline int64_t mxfp4_lanes_scale(int64_t n, int64_t b, int64_t K) {
  return ((n / kMxfp4LaneRows) * (K / kMxfp4BlockSize) + b) * kMxfp4LaneRows + n % kMxfp4LaneRows;
}

// Element (n, k) of a matrix stored in this layout (codes and scales), as mxfp4_get gives it.
inline float mxfp4_lanes_get(const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t k,
                             int64_t K) {
  return kE2m1Values[mxfp4_lanes_code(codes, n, k, K)] *
         e8m0_to_f32(scales[mxfp4_lanes_scale(n, k / kMxfp4BlockSize, K)]);
}

// Whether none of the n E8M0 scale bytes is 0 (2^-127, a subnormal factor) or 255 (NaN). Then
// every block's factor is its byte shifted into an f32 exponent field, and the kernels may skip
// the special cases (mxfp4_lanes_rows' normal_scales). The bytes' order does not matter, so it
// holds for scales in either layout, and for any rows of a matrix for which it holds.
bool mxfp4_scales_normal(const uint8_t* scales, int64_t n);

// Row-major codes [N, K/2] (low nibble = the even element) -> the codes' layout above, and
// row-major scales [N, K/32] -> the scales' layout. Each group of 16 rows keeps the bytes it
// had, so both can run in place, one group at a time. mxfp4_lanes_fit(N, K) must hold.
void pack_mxfp4_lane_codes(const uint8_t* in, int64_t N, int64_t K, uint8_t* out);
void pack_mxfp4_lane_codes_in_place(uint8_t* codes, int64_t N, int64_t K);
void pack_mxfp4_lane_scales(const uint8_t* in, int64_t N, int64_t K, uint8_t* out);
void pack_mxfp4_lane_scales_in_place(uint8_t* scales, int64_t N, int64_t K);

// Both parts at once: N * K / 2 and N * K / 32 bytes.
void pack_mxfp4_lanes(const uint8_t* codes, const uint8_t* scales, int64_t N, int64_t K,
                      uint8_t* out_codes, uint8_t* out_scales);

}  // namespace attnres
