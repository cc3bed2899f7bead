// The 16-row lane layout of an MXFP4 matrix W [N, K] (N % 16 == 0, K % 32 == 0), in which one
// vector lane holds one output row (kernels/mxfp4_lanes.h computes with it), as util/lanes.h
// does for BF16 weights.
//
// Rows are stored in groups of 16: group g holds rows 16g .. 16g + 15. Codes: for each pair q of
// elements (2q, 2q + 1) in order, the group's 16 rows' bytes of that pair side by side (low
// nibble = the even element, as in the row-major codes): row n's byte of pair q lies at
// (g K/2 + q) 16 + n mod 16. Scales: for each 32-element block b, the 16 rows' E8M0 bytes side
// by side, at (g K/32 + b) 16 + n mod 16. So a pair of 16 rows is one 16-byte load, which one
// zero-extension and one 32-entry word permute turn into 32 bf16 weights, and a block's 16
// scales are one 16-byte load.
#pragma once

#include <cstdint>

#include "util/numeric.h"

namespace attnres {

inline constexpr int64_t kMxfp4LaneRows = 16;

// Whether an [N, K] matrix can be stored in this layout.
inline bool mxfp4_lanes_fit(int64_t N, int64_t K) {
  return N % kMxfp4LaneRows == 0 && K % kMxfp4BlockSize == 0;
}

// Offset of row n's byte of pair q (elements 2q and 2q + 1).
inline int64_t mxfp4_lanes_byte(int64_t n, int64_t q, int64_t K) {
  return ((n / kMxfp4LaneRows) * (K / 2) + q) * kMxfp4LaneRows + n % kMxfp4LaneRows;
}

// Offset of row n's scale byte of block b.
inline int64_t mxfp4_lanes_scale(int64_t n, int64_t b, int64_t K) {
  return ((n / kMxfp4LaneRows) * (K / kMxfp4BlockSize) + b) * kMxfp4LaneRows + n % kMxfp4LaneRows;
}

// Element (n, k) of a matrix stored in this layout (codes and scales), as mxfp4_get gives it.
inline float mxfp4_lanes_get(const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t k,
                             int64_t K) {
  return mxfp4_value(codes[mxfp4_lanes_byte(n, k / 2, K)], k,
                     scales[mxfp4_lanes_scale(n, k / kMxfp4BlockSize, K)]);
}

// Both parts of the layout are one rule over a row-major byte matrix [N, C] (codes: C = K/2,
// scales: C = K/32): row n's byte c lies at ((n / 16) C + c) 16 + n mod 16. Each group of 16
// rows keeps the 16 C bytes it had, so the rule can run in place one group at a time.
// N % 16 == 0.
void pack_lane_groups(const uint8_t* in, int64_t N, int64_t C, uint8_t* out);
void pack_lane_groups_in_place(uint8_t* bytes, int64_t N, int64_t C);

// Row-major codes [N, K/2] and scales [N, K/32] -> the layout above (N * K / 2 and N * K / 32
// bytes). mxfp4_lanes_fit(N, K) must hold.
void pack_mxfp4_lanes(const uint8_t* codes, const uint8_t* scales, int64_t N, int64_t K,
                      uint8_t* out_codes, uint8_t* out_scales);

}  // namespace attnres
