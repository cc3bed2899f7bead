#include "util/mxfp4_lanes.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstring>
#include <vector>

#include "util/parallel.h"

namespace attnres {

namespace {

// The four nibbles at bits 0, 8, 16 and 24 of x, packed into bits 0-15 in that order.
uint32_t gather_nibbles(uint32_t x) {
  x &= 0x0f0f0f0fu;
  x = (x | x >> 4) & 0x00ff00ffu;
  return (x | x >> 8) & 0xffffu;
}

// One group's codes: rows [0, 16) of row-major codes (K/2 bytes each) -> `out` (16 K/2 bytes).
// Row r's four bytes of a quad hold its eight codes, element j of the quad in nibble j: the
// even elements' nibbles make the row's even word, the odd ones' its odd word.
void pack_code_group(const uint8_t* in, int64_t K, uint8_t* out) {
  static_assert(std::endian::native == std::endian::little, "codes are little-endian words");
  const int64_t C = K / 2;
  for (int64_t r = 0; r < kMxfp4LaneRows; ++r)
    for (int64_t quad = 0; quad < K / 8; ++quad) {
      uint32_t x;
      std::memcpy(&x, in + r * C + 4 * quad, 4);
      const uint32_t lane = gather_nibbles(x) | gather_nibbles(x >> 4) << 16;  // even, odd words
      std::memcpy(out + quad * kMxfp4QuadBytes + 4 * r, &lane, 4);
    }
}

// One group's scales: rows [0, 16) of row-major scales (C = K/32 bytes each) -> `out`, the 16
// rows' bytes of each block side by side.
void pack_scale_group(const uint8_t* in, int64_t C, uint8_t* out) {
  for (int64_t c = 0; c < C; ++c)
    for (int64_t r = 0; r < kMxfp4LaneRows; ++r) out[c * kMxfp4LaneRows + r] = in[r * C + c];
}

// Runs pack(group's row-major bytes, group's output) over the groups of N rows of C bytes each,
// from `in` to `out`, or in place (in == out) through a copy of each group; the groups of a
// large matrix in parallel (each group's bytes are its own).
template <class Pack>
void for_each_group(const uint8_t* in, int64_t N, int64_t C, uint8_t* out, const Pack& pack) {
  assert(N % kMxfp4LaneRows == 0);
  const int64_t group_bytes = kMxfp4LaneRows * C, groups = N / kMxfp4LaneRows;
  constexpr int64_t kParallelBytes = int64_t{1} << 16;
  parallel_ranges(groups, groups * group_bytes >= kParallelBytes, [&](int64_t g0, int64_t g1) {
    std::vector<uint8_t> copy;
    if (in == out) copy.resize(static_cast<size_t>(group_bytes));
    for (int64_t g = g0; g < g1; ++g) {
      const uint8_t* src = in + g * group_bytes;
      if (in == out) {
        std::memcpy(copy.data(), src, copy.size());
        src = copy.data();
      }
      pack(src, out + g * group_bytes);
    }
  });
}

}  // namespace

void pack_mxfp4_lane_codes(const uint8_t* in, int64_t N, int64_t K, uint8_t* out) {
  assert(mxfp4_lanes_fit(N, K));
  for_each_group(in, N, K / 2, out,
                 [&](const uint8_t* src, uint8_t* dst) { pack_code_group(src, K, dst); });
}

void pack_mxfp4_lane_codes_in_place(uint8_t* codes, int64_t N, int64_t K) {
  pack_mxfp4_lane_codes(codes, N, K, codes);
}

void pack_mxfp4_lane_scales(const uint8_t* in, int64_t N, int64_t K, uint8_t* out) {
  assert(mxfp4_lanes_fit(N, K));
  const int64_t C = K / kMxfp4BlockSize;
  for_each_group(in, N, C, out,
                 [&](const uint8_t* src, uint8_t* dst) { pack_scale_group(src, C, dst); });
}

bool mxfp4_scales_normal(const uint8_t* scales, int64_t n) {
  // The bytes' minimum and maximum, without an early exit, so that the compiler vectorises the
  // loop: a model's scales are checked once at load.
  uint8_t lo = 1, hi = 254;
  for (int64_t i = 0; i < n; ++i) {
    lo = std::min(lo, scales[i]);
    hi = std::max(hi, scales[i]);
  }
  return lo != 0 && hi != 255;
}

void pack_mxfp4_lane_scales_in_place(uint8_t* scales, int64_t N, int64_t K) {
  pack_mxfp4_lane_scales(scales, N, K, scales);
}

void pack_mxfp4_lanes(const uint8_t* codes, const uint8_t* scales, int64_t N, int64_t K,
                      uint8_t* out_codes, uint8_t* out_scales) {
  pack_mxfp4_lane_codes(codes, N, K, out_codes);
  pack_mxfp4_lane_scales(scales, N, K, out_scales);
}

}  // namespace attnres
