#include "kernels/norm.h"
#include "kernels/parallel.h"
#include "util/parallel.h"

#include <cmath>

namespace attnres {

void rms_norm_ref(const float* x, int64_t rows, int64_t D, const TensorView& gain, float eps,
                  bool bf16_out, float* y) {
  const bool has_gain = gain.data != nullptr;
  parallel_ranges(rows, rows * D > kParallelMinWork, [&](int64_t r_begin, int64_t r_end) {
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* xr = x + r * D;
      float* yr = y + r * D;
      float ss = 0.0f;
      for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
      for (int64_t i = 0; i < D; ++i) {
        float v = xr[i] * inv;
        if (bf16_out) v = round_bf16(v);
        if (has_gain) v *= gain_at(gain, i);
        yr[i] = bf16_out ? round_bf16(v) : v;
      }
    }
  });
}

void l2_norm_ref(const float* x, int64_t rows, int64_t D, float eps, float scale, float* y) {
  parallel_ranges(rows, rows * D > kParallelMinWork, [&](int64_t r_begin, int64_t r_end) {
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* xr = x + r * D;
      float* yr = y + r * D;
      float ss = 0.0f;
      for (int64_t i = 0; i < D; ++i) ss += xr[i] * xr[i];
      const float inv = 1.0f / std::sqrt(ss + eps);
      for (int64_t i = 0; i < D; ++i) yr[i] = xr[i] * inv * scale;
    }
  });
}

void gated_rms_norm_ref(const float* o, const float* gate, int64_t rows, int64_t D,
                        const TensorView& gain, float eps, bool bf16_out, float* y) {
  parallel_ranges(rows, rows * D > kParallelMinWork, [&](int64_t r_begin, int64_t r_end) {
    for (int64_t r = r_begin; r < r_end; ++r) {
      const float* orow = o + r * D;
      const float* grow = gate + r * D;
      float* yr = y + r * D;
      float ss = 0.0f;
      for (int64_t i = 0; i < D; ++i) ss += orow[i] * orow[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
      for (int64_t i = 0; i < D; ++i) {
        const float sig = 1.0f / (1.0f + std::exp(-grow[i]));
        const float v = orow[i] * inv * gain_at(gain, i) * sig;
        yr[i] = bf16_out ? round_bf16(v) : v;
      }
    }
  });
}

void round_to_bf16_ref(float* x, int64_t n, bool enabled) {
  if (!enabled) return;
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

}  // namespace attnres
