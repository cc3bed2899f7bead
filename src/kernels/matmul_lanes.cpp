// Packing and the scalar twins of the lane-packed projections (matmul_lanes.h).
#include "kernels/matmul_lanes.h"

#include <algorithm>
#include <cassert>
#include <cmath>

namespace attnres {

// Out of line on purpose: GCC 12.2 at -O3 vectorizes the same two steps written inline as
// additions in the twins' loops into wrong sums (an all-integer dot product of K = 30 came out
// -7 instead of -10).
[[gnu::noinline]] float lane_pair_step(float acc, float x_odd, float w_odd, float x_even,
                                       float w_even) {
  return std::fma(x_even, w_even, std::fma(x_odd, w_odd, acc));
}

namespace {

// The twins' loop over tokens, rows and pairs; x_at(t, k) is token t's value k as f32.
template <class XAt>
void lanes_ref(const XAt& x_at, int64_t T, const bf16* packed, int64_t N, int64_t K, int64_t row0,
               int64_t rows, float* y, int64_t ldy) {
  assert(K % 2 == 0 && row0 >= 0 && rows >= 0 && row0 + rows <= N);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = row0; n < row0 + rows; ++n) {
      float acc = 0.0f;
      for (int64_t q = 0; q < K / 2; ++q) {
        const bf16* w = packed + lanes_index(n, 2 * q, N, K);
        acc = lane_pair_step(acc, x_at(t, 2 * q + 1), bf16_to_f32(w[1]), x_at(t, 2 * q),
                             bf16_to_f32(w[0]));
      }
      y[t * ldy + n - row0] = acc;
    }
}

}  // namespace

void matmul_bf16_lanes_ref(const bf16* x, int64_t T, const bf16* packed, int64_t N, int64_t K,
                           int64_t row0, int64_t rows, float* y, int64_t ldy) {
  lanes_ref([&](int64_t t, int64_t k) { return bf16_to_f32(x[t * K + k]); }, T, packed, N, K, row0,
            rows, y, ldy);
}

void matmul_lanes_ref(const float* x, int64_t T, const bf16* packed, int64_t N, int64_t K,
                      int64_t row0, int64_t rows, float* y, int64_t ldy) {
  lanes_ref([&](int64_t t, int64_t k) { return x[t * K + k]; }, T, packed, N, K, row0, rows, y,
            ldy);
}

}  // namespace attnres
