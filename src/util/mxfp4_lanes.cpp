#include "util/mxfp4_lanes.h"

#include <cassert>

namespace attnres {

void pack_mxfp4_lanes(const uint8_t* codes, const uint8_t* scales, int64_t N, int64_t K,
                      uint8_t* out_codes, uint8_t* out_scales) {
  assert(mxfp4_lanes_fit(N, K));
  const int64_t pairs = K / 2, blocks = K / kMxfp4BlockSize;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t q = 0; q < pairs; ++q) out_codes[mxfp4_lanes_byte(n, q, K)] = codes[n * pairs + q];
    for (int64_t b = 0; b < blocks; ++b)
      out_scales[mxfp4_lanes_scale(n, b, K)] = scales[n * blocks + b];
  }
}

}  // namespace attnres
