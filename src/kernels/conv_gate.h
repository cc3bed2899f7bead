// Scalar twins of KDA's short causal convolution and forget gate. The kernels themselves,
// causal_conv1d_silu and kda_gate, are declared (with their contracts) in kda.h and defined in
// conv_gate_hwy.cpp with Highway runtime dispatch; these _ref versions (conv_gate.cpp, the
// original scalar loops) define the numerics and take the same arguments.
//
// What the SIMD versions change: the convolution runs over a vector of channels at a time with
// the twin's products and sums in the twin's order, unfused (bitwise the same pre-activation);
// SiLU,
// the sigmoid and softplus use Highway's Exp (<= 1 ulp) and Log1p (<= 2 ulp) instead of libm.
// Every element's value depends only on its own inputs, never on its position or the thread
// count. tests/unit/kernels/test_rowops.cpp bounds the difference.
#pragma once

#include <cstdint>
#include <optional>

#include "kernels/kda.h"

namespace attnres {

void causal_conv1d_silu_ref(const float* x, int64_t T, int64_t C, const float* weight, int W,
                            float* state, float* y);
void kda_gate_ref(const float* f, int64_t T, int64_t H, int64_t dk, const float* a_log,
                  const float* dt_bias, std::optional<float> lower_bound, float* g);

}  // namespace attnres
