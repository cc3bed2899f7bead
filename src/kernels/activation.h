// Pointwise activations: SiTU (Kimi-K3's gated activation), SiLU and the logistic sigmoid.
//
// SiTU(g, u) = b * tanh(g / b) * sigmoid(g) * bl * tanh(u / bl), in f32 (the sigmoid takes the
// raw gate, not the capped one; the up branch is capped by bl). Reference: the SiTU of the
// official modeling code, as in the public K3 ports (`situ_and_mul`).
#pragma once

#include <cmath>
#include <cstdint>

#include "util/numeric.h"

namespace attnres {

inline float sigmoidf(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
inline float siluf(float x) {
  return x / (1.0f + std::exp(-x));
}
inline float situf(float g, float u, float beta, float linear_beta) {
  return beta * std::tanh(g / beta) * sigmoidf(g) * (linear_beta * std::tanh(u / linear_beta));
}

// out[i] = SiTU(gate[i], up[i]); out may alias gate or up. With `bf16_out` the result is rounded
// to bf16 (the bf16 model casts the f32 activation back to the input dtype).
// situ() is the dispatched SIMD kernel (activation_hwy.cpp: Highway Expm1/Exp, a few ulp from
// libm; each element's value depends only on its inputs, never on its position or the thread
// count); situ_ref() is its scalar twin, situf() element by element.
void situ(const float* gate, const float* up, int64_t n, float beta, float linear_beta,
          bool bf16_out, float* out);
void situ_ref(const float* gate, const float* up, int64_t n, float beta, float linear_beta,
              bool bf16_out, float* out);
// The bf16 result stored as bf16 (a matmul job's bf16 tokens): out[i] = f32_to_bf16 of what
// situ(..., bf16_out = true, ...) gives; out must not overlap the inputs.
void situ(const float* gate, const float* up, int64_t n, float beta, float linear_beta, bf16* out);
void situ_ref(const float* gate, const float* up, int64_t n, float beta, float linear_beta,
              bf16* out);
// out[i] = SiLU(gate[i]) * up[i] (Kimi-Linear's activation); out may alias either input; with
// `bf16_out` the product is rounded to bf16. silu_mul() is the dispatched SIMD kernel
// (silu_hwy.cpp: Highway Exp, <= 1 ulp; position- and thread-count-independent); silu_mul_ref()
// is its scalar twin, siluf(gate) * up element by element.
void silu_mul(const float* gate, const float* up, int64_t n, bool bf16_out, float* out);
void silu_mul_ref(const float* gate, const float* up, int64_t n, bool bf16_out, float* out);
// The bf16 result stored as bf16, as situ's bf16 overload.
void silu_mul(const float* gate, const float* up, int64_t n, bf16* out);
void silu_mul_ref(const float* gate, const float* up, int64_t n, bf16* out);

}  // namespace attnres
