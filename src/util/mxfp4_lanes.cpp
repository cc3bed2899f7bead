#include "util/mxfp4_lanes.h"

#include <cassert>
#include <cstring>
#include <vector>

namespace attnres {

namespace {
// One group: rows [0, 16) of `in` (C bytes each) -> `out` (16 C bytes), written in order (the
// 16 rows are read side by side).
void pack_group(const uint8_t* in, int64_t C, uint8_t* out) {
  for (int64_t c = 0; c < C; ++c)
    for (int64_t r = 0; r < kMxfp4LaneRows; ++r) out[c * kMxfp4LaneRows + r] = in[r * C + c];
}
}  // namespace

void pack_lane_groups(const uint8_t* in, int64_t N, int64_t C, uint8_t* out) {
  assert(N % kMxfp4LaneRows == 0);
  for (int64_t g = 0; g < N; g += kMxfp4LaneRows) pack_group(in + g * C, C, out + g * C);
}

void pack_lane_groups_in_place(uint8_t* bytes, int64_t N, int64_t C) {
  assert(N % kMxfp4LaneRows == 0);
  std::vector<uint8_t> group(static_cast<size_t>(kMxfp4LaneRows * C));
  for (int64_t g = 0; g < N; g += kMxfp4LaneRows) {
    std::memcpy(group.data(), bytes + g * C, group.size());
    pack_group(group.data(), C, bytes + g * C);
  }
}

void pack_mxfp4_lanes(const uint8_t* codes, const uint8_t* scales, int64_t N, int64_t K,
                      uint8_t* out_codes, uint8_t* out_scales) {
  assert(mxfp4_lanes_fit(N, K));
  pack_lane_groups(codes, N, K / 2, out_codes);
  pack_lane_groups(scales, N, K / kMxfp4BlockSize, out_scales);
}

}  // namespace attnres
