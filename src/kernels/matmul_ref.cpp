// Scalar reference projections: they define the numerics (f32 products of the exactly widened
// weights, accumulated sequentially in k order, no fma). Single-threaded and slow by design; the
// dispatched kernels in matmul_hwy.cpp are tested against them.
#include <bit>
#include <cstring>

#include "kernels/matmul.h"

namespace attnres {
namespace {

template <typename LoadW>
void matmul_rows(const float* x, int64_t T, int64_t N, int64_t K, float* y, LoadW load_w) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * K;
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += xr[k] * load_w(n, k);
      y[t * N + n] = acc;
    }
  }
}

}  // namespace

void matmul_ref(const float* x, int64_t T, const TensorView& W, float* y) {
  const int64_t N = W.shape[0], K = W.shape[1];
  if (W.layout == Layout::kBf16Lanes) {
    matmul_rows(x, T, N, K, y, [&W, K](int64_t n, int64_t k) { return W.get_f32(n * K + k); });
  } else if (W.dtype == DType::kBF16) {
    const bf16* w = W.as<bf16>();
    matmul_rows(x, T, N, K, y, [w, K](int64_t n, int64_t k) { return bf16_to_f32(w[n * K + k]); });
  } else {
    const float* w = W.as<float>();
    matmul_rows(x, T, N, K, y, [w, K](int64_t n, int64_t k) { return w[n * K + k]; });
  }
}

void matmul_bf16_ref(const bf16* x, int64_t T, const TensorView& W, float* y) {
  const int64_t N = W.shape[0], K = W.shape[1];
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        acc += bf16_to_f32(x[t * K + k]) * W.get_f32(n * K + k);
      }
      y[t * N + n] = acc;
    }
  }
}

void mxfp4_matmul_ref(const float* x, int64_t T, const uint8_t* packed, const uint8_t* scale,
                      int64_t N, int64_t K, float* y) {
  matmul_rows(x, T, N, K, y, [=](int64_t n, int64_t k) {
    return mxfp4_get(packed + n * (K / 2), scale + n * (K / kMxfp4BlockSize), k);
  });
}

bool bf16_exact_copy_ref(const float* x, int64_t n, bf16* out) {
  uint32_t inexact = 0;  // OR of the dropped low halves of the non-NaN values
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = std::bit_cast<uint32_t>(x[i]);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    // A NaN keeps its sign and becomes the quiet bf16 NaN (truncating its payload could give
    // an infinity); every product with it is NaN in either kernel.
    out[i] = bf16{static_cast<uint16_t>(nan ? ((u >> 16) & 0x8000u) | 0x7fc0u : u >> 16)};
    inexact |= nan ? 0u : (u & 0xffffu);
  }
  return inexact == 0;
}

}  // namespace attnres
