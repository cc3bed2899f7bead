// Packing and the scalar twin of the lane-packed projections (matmul_lanes.h).
#include "kernels/matmul_lanes.h"

#include <algorithm>
#include <cassert>

namespace attnres {
namespace {

// One lane step of vdpbf16ps: the odd product, then the even one, each addition rounded (both
// products are exact in f32). Out of line on purpose: GCC 12.2 at -O3 vectorizes the same two
// additions written inline in the loop below into wrong sums (an all-integer dot product of
// K = 30 came out -7 instead of -10).
[[gnu::noinline]] float lane_step(float acc, float odd_product, float even_product) {
  return (acc + odd_product) + even_product;
}

}  // namespace

void pack_bf16_lanes(const bf16* w, int64_t N, int64_t K, bf16* out) {
  assert(K % 2 == 0);
  const int64_t groups = (N + kLaneGroupRows - 1) / kLaneGroupRows;
  for (int64_t g = 0; g < groups; ++g) {
    bf16* group = out + g * kLaneGroupRows * K;
    for (int64_t j = 0; j < kLaneGroupRows; ++j) {
      const int64_t n = g * kLaneGroupRows + j;
      for (int64_t q = 0; q < K / 2; ++q) {
        bf16* dst = group + (q * kLaneGroupRows + j) * 2;
        dst[0] = n < N ? w[n * K + 2 * q] : bf16{0};
        dst[1] = n < N ? w[n * K + 2 * q + 1] : bf16{0};
      }
    }
  }
}

void matmul_bf16_lanes_ref(const bf16* x, int64_t T, const bf16* packed, int64_t N, int64_t K,
                           int64_t row0, int64_t rows, float* y, int64_t ldy) {
  assert(K % 2 == 0 && row0 >= 0 && rows >= 0 && row0 + rows <= N);
  (void)N;  // only the contract's check reads it
  for (int64_t t = 0; t < T; ++t) {
    const bf16* xt = x + t * K;
    for (int64_t g = row0 / kLaneGroupRows; g * kLaneGroupRows < row0 + rows; ++g) {
      const bf16* group = packed + g * kLaneGroupRows * K;
      const int64_t first = g * kLaneGroupRows;
      const int64_t lo = std::max<int64_t>(row0 - first, 0);
      const int64_t hi = std::min<int64_t>(row0 + rows - first, kLaneGroupRows);
      for (int64_t j = lo; j < hi; ++j) {
        float acc = 0.0f;
        for (int64_t q = 0; q < K / 2; ++q) {
          const bf16* w = group + (q * kLaneGroupRows + j) * 2;
          acc = lane_step(acc, bf16_to_f32(xt[2 * q + 1]) * bf16_to_f32(w[1]),
                          bf16_to_f32(xt[2 * q]) * bf16_to_f32(w[0]));
        }
        y[t * ldy + first + j - row0] = acc;
      }
    }
  }
}

}  // namespace attnres
