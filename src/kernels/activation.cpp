#include "kernels/activation.h"

#include "util/numeric.h"

namespace attnres {

void situ_ref(const float* gate, const float* up, int64_t n, float beta, float linear_beta,
              bool bf16_out, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = situf(gate[i], up[i], beta, linear_beta);
    out[i] = bf16_out ? round_bf16(v) : v;
  }
}

void situ_ref(const float* gate, const float* up, int64_t n, float beta, float linear_beta,
              bf16* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(situf(gate[i], up[i], beta, linear_beta));
}

void silu_mul_ref(const float* gate, const float* up, int64_t n, bf16* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(siluf(gate[i]) * up[i]);
}

void silu_mul_ref(const float* gate, const float* up, int64_t n, bool bf16_out, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = siluf(gate[i]) * up[i];
    out[i] = bf16_out ? round_bf16(v) : v;
  }
}

}  // namespace attnres
