// Packing into the lane-packed layout (util/lanes.h).
#include "util/lanes.h"

#include <algorithm>
#include <cassert>

namespace attnres {

void pack_bf16_lanes_group(const bf16* rows, int64_t g, int64_t N, int64_t K, bf16* out) {
  assert(K % 2 == 0);
  const int64_t R = lanes_group_rows(N, g), have = std::min(kLaneGroupRows, N - g * kLaneGroupRows);
  bf16* group = out + g * kLaneGroupRows * K;
  for (int64_t q = 0; q < K / 2; ++q)  // the group's storage in order
    for (int64_t j = 0; j < R; ++j) {
      bf16* dst = group + (q * R + j) * 2;
      dst[0] = j < have ? rows[j * K + 2 * q] : bf16{0};
      dst[1] = j < have ? rows[j * K + 2 * q + 1] : bf16{0};
    }
}

void pack_bf16_lanes(const bf16* w, int64_t N, int64_t K, bf16* out) {
  for (int64_t g = 0; g * kLaneGroupRows < N; ++g)
    pack_bf16_lanes_group(w + g * kLaneGroupRows * K, g, N, K, out);
}

}  // namespace attnres
