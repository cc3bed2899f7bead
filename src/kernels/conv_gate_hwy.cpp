// causal_conv1d_silu and kda_gate (kda.h) with Highway runtime dispatch; scalar twins in
// conv_gate.cpp (conv_gate.h).
//
// Convolution: a vector holds L consecutive channels. For each block of L channels the W - 1
// previous inputs of every lane live in a small window (loaded from and written back to
// `state`), and each token's pre-activation is accumulated as the twin does, from 0, adding
// w[j] * window[j] for j = 0..W-1 with a separate multiply and add: this file is compiled with
// -ffp-contract=off (CMakeLists.txt), so the pre-activation is bitwise the twin's; only SiLU
// differs (Highway's Exp). The current input is read before the output is stored, so y may
// alias x. The last block's missing lanes are zero-padded and never stored. W = 4 (Kimi-Linear
// and Kimi-K3) has its own instantiation so the window can stay in registers.
//
// Gate: element-wise over [T, H, dk] with the twin's formulas and operation order; a = exp(a_log)
// is the twin's scalar expf per head.
//
// Threads: channel blocks (conv) or (token, head) rows (gate) are split statically; every
// element's value depends only on its own inputs, so nothing depends on the split.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/conv_gate_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cassert>
#include <cmath>
#include <cstdint>
#include <optional>

#include "kernels/conv_gate.h"
#include "kernels/parallel.h"
#include "kernels/rowops_hwy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// One block of m <= L channels starting at c0, all T tokens. kW > 0 fixes the width at compile
// time; kW == 0 reads it from W.
template <int kW>
HWY_INLINE void ConvBlock(const float* x, int64_t T, int64_t C, int64_t c0, int64_t m,
                          const float* weight, int W_runtime, float* state, float* y) {
  const DF d;
  constexpr size_t kL = hn::MaxLanes(DF());
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int W = kW > 0 ? kW : W_runtime;
  const int hist = W - 1;
  // wt[j][lane] = weight[c0 + lane, j]; win[j][lane] = input j steps into the window (oldest
  // first). Padded lanes hold zeros.
  HWY_ALIGN float wt[kMaxConvWidth][kL] = {};
  HWY_ALIGN float win[kMaxConvWidth][kL] = {};
  for (int64_t l = 0; l < m; ++l) {
    for (int j = 0; j < W; ++j) wt[j][l] = weight[(c0 + l) * W + j];
    for (int j = 0; j < hist; ++j) win[j][l] = state[(c0 + l) * hist + j];
  }
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * C + c0;
    float* yt = y + t * C + c0;
    const VF cur = m == L ? hn::LoadU(d, xt) : LoadTail(d, xt, static_cast<size_t>(m));
    VF acc = hn::Zero(d);
    for (int j = 0; j < hist; ++j)
      acc = hn::Add(acc, hn::Mul(hn::Load(d, wt[j]), hn::Load(d, win[j])));
    acc = hn::Add(acc, hn::Mul(hn::Load(d, wt[hist]), cur));
    const VF out = SiluVec(d, acc);
    if (m == L) {
      hn::StoreU(out, d, yt);
    } else {
      StoreTail(d, out, yt, static_cast<size_t>(m));
    }
    if (hist > 0) {
      for (int j = 0; j + 1 < hist; ++j) hn::Store(hn::Load(d, win[j + 1]), d, win[j]);
      hn::Store(cur, d, win[hist - 1]);
    }
  }
  for (int64_t l = 0; l < m; ++l)
    for (int j = 0; j < hist; ++j) state[(c0 + l) * hist + j] = win[j][l];
}

void CausalConv1dSilu(const float* x, int64_t T, int64_t C, const float* weight, int W,
                      float* state, float* y) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t blocks = (C + L - 1) / L;
#pragma omp parallel for schedule(static) if (T * C * W > kParallelMinWork)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * L, m = C - c0 < L ? C - c0 : L;
    if (W == 4) {
      ConvBlock<4>(x, T, C, c0, m, weight, W, state, y);
    } else {
      ConvBlock<0>(x, T, C, c0, m, weight, W, state, y);
    }
  }
}

void KdaGate(const float* f, int64_t T, int64_t H, int64_t dk, const float* a_log,
             const float* dt_bias, bool has_lower_bound, float lower_bound, float* g) {
#pragma omp parallel for schedule(static) if (T * H * dk > kParallelMinWork)
  for (int64_t row = 0; row < T * H; ++row) {
    const DF d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    const int64_t h = row % H;
    const float a = std::exp(a_log[h]);
    const float* fr = f + row * dk;      // [dk] of token row / H, head h
    const float* br = dt_bias + h * dk;  // [dk]
    float* gr = g + row * dk;            // [dk]
    const VF va = hn::Set(d, a), vneg_a = hn::Set(d, -a), vlb = hn::Set(d, lower_bound);
    auto gate = [&](VF z) {
      return has_lower_bound ? hn::Mul(vlb, SigmoidVec(d, hn::Mul(va, z)))
                             : hn::Mul(vneg_a, SoftplusVec(d, z));
    };
    int64_t i = 0;
    for (; i + L <= dk; i += L)
      hn::StoreU(gate(hn::Add(hn::LoadU(d, fr + i), hn::LoadU(d, br + i))), d, gr + i);
    if (i < dk) {
      const size_t rest = static_cast<size_t>(dk - i);
      StoreTail(d, gate(hn::Add(LoadTail(d, fr + i, rest), LoadTail(d, br + i, rest))), gr + i,
                rest);
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(CausalConv1dSilu);
HWY_EXPORT(KdaGate);

void causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* weight, int W,
                        float* state, float* y) {
  assert(W >= 1 && W <= kMaxConvWidth);
  HWY_DYNAMIC_DISPATCH(CausalConv1dSilu)(x, T, C, weight, W, state, y);
}

void kda_gate(const float* f, int64_t T, int64_t H, int64_t dk, const float* a_log,
              const float* dt_bias, std::optional<float> lower_bound, float* g) {
  HWY_DYNAMIC_DISPATCH(KdaGate)
  (f, T, H, dk, a_log, dt_bias, lower_bound.has_value(), lower_bound.value_or(0.0f), g);
}

}  // namespace attnres
#endif  // HWY_ONCE
