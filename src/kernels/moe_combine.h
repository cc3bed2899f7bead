// The MoE combine: a token's row y [n] accumulates its routed experts' output rows, each times
// its combine weight, in slot order:
//   y[i] = (...((y[i] + w[0] x_0[i]) + w[1] x_1[i]) ...) + w[k-1] x_{k-1}[i],
// with x_s = x + rows[s] * ldx; every term is a product, then a sum, in f32 (no fused
// multiply-add).
//
// moe_combine (moe_combine_hwy.cpp, Highway dispatch) keeps vectors of y in registers over the
// k slots: one load and one store of y per element instead of k. moe_combine_ref
// (moe_combine.cpp) is the scalar twin, slot by slot. Both files are compiled without
// contraction (CMakeLists.txt), so every element goes through the same IEEE operations in the
// same order: bitwise the same results on every target. One call is one token, on the calling
// thread; x rows may repeat, y must not overlap them.
#pragma once

#include <cstdint>

namespace attnres {

void moe_combine(const float* x, int64_t ldx, const int64_t* rows, const float* w, int64_t k,
                 int64_t n, float* y);
void moe_combine_ref(const float* x, int64_t ldx, const int64_t* rows, const float* w, int64_t k,
                     int64_t n, float* y);

}  // namespace attnres
