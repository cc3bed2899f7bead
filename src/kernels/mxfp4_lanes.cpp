// The scalar twin of the MXFP4 lane projections (mxfp4_lanes.h).
#include "kernels/mxfp4_lanes.h"

#include <cassert>
#include <cmath>

#include "kernels/matmul_lanes.h"

namespace attnres {

void mxfp4_lanes_ref(const bf16* xh, const float* x, int64_t T, const uint8_t* codes,
                     const uint8_t* scales, int64_t N, int64_t K, int64_t row0, int64_t rows,
                     float* y, int64_t ldy) {
  assert(mxfp4_lanes_fit(N, K) && row0 >= 0 && rows >= 0 && row0 + rows <= N);
  (void)N;
  const auto x_at = [&](int64_t t, int64_t k) {
    return xh != nullptr ? bf16_to_f32(xh[t * K + k]) : x[t * K + k];
  };
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = row0; n < row0 + rows; ++n) {
      float acc = 0.0f;
      for (int64_t b = 0; b < K / kMxfp4BlockSize; ++b) {
        float s = 0.0f;
        for (int64_t q = b * kMxfp4BlockSize / 2; q < (b + 1) * kMxfp4BlockSize / 2; ++q) {
          s = lane_pair_step(s, x_at(t, 2 * q + 1),
                             kE2m1Values[mxfp4_lanes_code(codes, n, 2 * q + 1, K)], x_at(t, 2 * q),
                             kE2m1Values[mxfp4_lanes_code(codes, n, 2 * q, K)]);
        }
        acc = std::fma(s, e8m0_to_f32(scales[mxfp4_lanes_scale(n, b, K)]), acc);
      }
      y[t * ldy + n - row0] = acc;
    }
}

}  // namespace attnres
