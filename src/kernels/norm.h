// Row normalisations used by every block: RMSNorm (with a BF16 or F32 gain), the per-head L2
// norm of KDA's q and k, and KDA's gated output RMSNorm.
//
// Contract: rows are contiguous, [rows, D] row-major f32; y may alias x (each row is reduced
// before it is written). Each row is produced by one thread with a fixed reduction order, so
// results do not depend on the thread count. These scalar loops are the reference numerics.
#pragma once

#include <cstdint>

#include "util/tensor.h"

namespace attnres {

// y = gain * (x * rsqrt(mean(x^2) + eps)), as HF KimiRMSNorm: normalise in f32; with
// `bf16_out` the normalised row is rounded to bf16 before the gain multiply and the product is
// rounded again (the bf16 model's `weight * x.to(bf16)`). An empty gain view means gain 1.
void rms_norm(const float* x, int64_t rows, int64_t D, const TensorView& gain, float eps,
              bool bf16_out, float* y);

// y = x / sqrt(sum(x^2) + eps) * scale over consecutive groups of D (fla's l2norm; eps inside
// the sqrt).
void l2_norm(const float* x, int64_t rows, int64_t D, float eps, float scale, float* y);

// KDA output norm (fla FusedRMSNormGated, sigmoid): over each head of D values,
// y = rmsnorm(o) * gain * sigmoid(gate). gain is [D] F32/BF16; gate is [rows, D]; y may alias o.
void gated_rms_norm(const float* o, const float* gate, int64_t rows, int64_t D,
                    const TensorView& gain, float eps, bool bf16_out, float* y);

// Element i of a 1-D gain view (F32 or BF16) widened to f32.
inline float gain_at(const TensorView& g, int64_t i) {
  return g.dtype == DType::kBF16 ? bf16_to_f32(g.as<bf16>()[i]) : g.as<float>()[i];
}

// Rounds n values to bf16 in place (no-op loop when !enabled).
inline void round_to_bf16(float* x, int64_t n, bool enabled) {
  if (!enabled) return;
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}

}  // namespace attnres
