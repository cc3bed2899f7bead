// Row normalisations used by every block: RMSNorm (with a BF16 or F32 gain), the per-head L2
// norm of KDA's q and k, and KDA's gated output RMSNorm.
//
// Contract: rows are contiguous, [rows, D] row-major f32; y may alias x (each row is reduced
// before it is written). Each row is produced by one thread with a fixed reduction order, so
// results do not depend on the thread count.
//
// Each kernel has two definitions with the same signature: NAME (norm_hwy.cpp, Highway runtime
// dispatch) and its scalar twin NAME_ref (norm.cpp), which defines the numerics. The SIMD path
// sums the squares lane-parallel in an order fixed by D and the target (never by the row's
// index or the thread count) and evaluates gated_rms_norm's sigmoid with Highway's Exp; every
// other step (the rsqrt, the products, the bf16 roundings) is the twin's operation in the same
// order. tests/unit/kernels/test_rowops.cpp bounds the difference.
#pragma once

#include <cstdint>

#include "util/tensor.h"

namespace attnres {

// y = gain * (x * rsqrt(mean(x^2) + eps)), as HF KimiRMSNorm: normalise in f32; with
// `bf16_out` the normalised row is rounded to bf16 before the gain multiply and the product is
// rounded again (the bf16 model's `weight * x.to(bf16)`). An empty gain view means gain 1.
void rms_norm(const float* x, int64_t rows, int64_t D, const TensorView& gain, float eps,
              bool bf16_out, float* y);
void rms_norm_ref(const float* x, int64_t rows, int64_t D, const TensorView& gain, float eps,
                  bool bf16_out, float* y);

// y = x / sqrt(sum(x^2) + eps) * scale over consecutive groups of D (fla's l2norm; eps inside
// the sqrt).
void l2_norm(const float* x, int64_t rows, int64_t D, float eps, float scale, float* y);
void l2_norm_ref(const float* x, int64_t rows, int64_t D, float eps, float scale, float* y);

// KDA output norm (fla FusedRMSNormGated, sigmoid): over each head of D values,
// y = rmsnorm(o) * gain * sigmoid(gate). gain is [D] F32/BF16 (required); gate is [rows, D];
// y may alias o.
void gated_rms_norm(const float* o, const float* gate, int64_t rows, int64_t D,
                    const TensorView& gain, float eps, bool bf16_out, float* y);
void gated_rms_norm_ref(const float* o, const float* gate, int64_t rows, int64_t D,
                        const TensorView& gain, float eps, bool bf16_out, float* y);

// Element i of a 1-D gain view (F32 or BF16) widened to f32.
inline float gain_at(const TensorView& g, int64_t i) {
  return g.dtype == DType::kBF16 ? bf16_to_f32(g.as<bf16>()[i]) : g.as<float>()[i];
}

// Rounds n values in place to the nearest bf16 value (round_bf16: ties to even, NaN quieted),
// kept in f32; nothing when !enabled. The SIMD path is bit-exact with the twin.
void round_to_bf16(float* x, int64_t n, bool enabled);
void round_to_bf16_ref(float* x, int64_t n, bool enabled);

}  // namespace attnres
