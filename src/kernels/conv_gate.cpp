// Scalar twins of KDA's short causal convolution and forget gate (conv_gate.h): the reference
// numerics for causal_conv1d_silu and kda_gate (kda.h, conv_gate_hwy.cpp).
#include <cassert>
#include <cmath>
#include <cstdint>
#include <optional>

#include "kernels/activation.h"
#include "kernels/conv_gate.h"
#include "kernels/parallel.h"
#include "util/parallel.h"

namespace attnres {

void causal_conv1d_silu_ref(const float* x, int64_t T, int64_t C, const float* weight, int W,
                            float* state, float* y) {
  assert(W >= 1 && W <= kMaxConvWidth);
  const int hist = W - 1;
  parallel_ranges(C, T * C * W > kParallelMinWork, [&](int64_t c_begin, int64_t c_end) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      // window[0..hist-1] = the previous hist inputs (oldest first), window[hist] = current.
      float window[kMaxConvWidth];
      float* st = state + c * hist;
      for (int j = 0; j < hist; ++j) window[j] = st[j];
      const float* w = weight + c * W;
      for (int64_t t = 0; t < T; ++t) {
        window[hist] = x[t * C + c];  // read before the (possibly aliased) write below
        float acc = 0.0f;
        for (int j = 0; j < W; ++j) acc += w[j] * window[j];
        y[t * C + c] = siluf(acc);
        for (int j = 0; j < hist; ++j) window[j] = window[j + 1];
      }
      for (int j = 0; j < hist; ++j) st[j] = window[j];
    }
  });
}

void kda_gate_ref(const float* f, int64_t T, int64_t H, int64_t dk, const float* a_log,
                  const float* dt_bias, std::optional<float> lower_bound, float* g) {
  const int64_t P = H * dk;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const float a = std::exp(a_log[h]);
      for (int64_t i = 0; i < dk; ++i) {
        const int64_t c = h * dk + i;
        const float z = f[t * P + c] + dt_bias[c];
        if (lower_bound) {
          g[t * P + c] = *lower_bound * sigmoidf(a * z);
        } else {
          // softplus with torch's threshold (20): linear above it.
          const float sp = z > 20.0f ? z : std::log1p(std::exp(z));
          g[t * P + c] = -a * sp;
        }
      }
    }
  }
}

}  // namespace attnres
