// causal_conv1d_silu and kda_gate (kda.h) with Highway runtime dispatch; scalar twins in
// conv_gate.cpp (conv_gate.h).
//
// Convolution: channels are processed in tiles of kTileVecs vectors; within a tile, token by
// token, each vector of channels accumulates its pre-activation as the twin does, from 0, adding
// w[j] * window[j] for j = 0..W-1 with a separate multiply and add: this file is compiled with
// -ffp-contract=off (CMakeLists.txt), so the pre-activation is bitwise the twin's; only SiLU
// differs (Highway's Exp). Each channel's last W inputs live in a small ring in L1 (loaded from
// and written back to `state`), and the current input is read before the output is stored, so
// y may alias x. Width 4 (Kimi-Linear and Kimi-K3) deinterleaves weights and state with
// LoadInterleaved4/3.
//
// Gate: element-wise over [T, H, dk] with the twin's formulas and operation order; a = exp(a_log)
// is the twin's scalar expf per head.
//
// Threads: channel ranges (conv) or (token, head) rows (gate) in parallel_ranges; every
// element's value depends only on its own inputs, so nothing depends on the split.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/conv_gate_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <optional>

#include "kernels/conv_gate.h"
#include "kernels/parallel.h"
#include "kernels/rowops_hwy-inl.h"
#include "util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Channels per tile: kTileVecs vectors (1 KiB of each token's row on AVX-512), so every token
// row of a tile is read as one contiguous run and the tile's window and weights stay in L1.
constexpr int64_t kTileVecs = 16;

// One tile of m channels starting at c0 (all but the tile's last vector are full), all T
// tokens. ring holds each channel's last W inputs: the input of token t goes to row t % W, so
// token t's window, oldest first, is rows (t + 1 + j) % W, j = 0..W-1 (the last is t's own).
// Before token 0, rows 1..W-1 hold `state` (oldest first); after token T-1 the new state is
// rows (T + 1 + j) % W, j = 0..W-2. Padded lanes hold zeros and are never stored.
HWY_INLINE void ConvTile(const float* x, int64_t T, int64_t C, int64_t c0, int64_t m,
                         const float* weight, int W, float* state, float* y) {
  const DF d;
  constexpr size_t kCap = kTileVecs * hn::MaxLanes(DF());
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int hist = W - 1;
  const int64_t nv = (m + L - 1) / L;
  HWY_ALIGN float wt[kMaxConvWidth][kCap];    // wt[j][i] = weight[c0 + i, j]
  HWY_ALIGN float ring[kMaxConvWidth][kCap];  // [W][tile]: the last W inputs
  for (int64_t v = 0; v < nv; ++v) {
    const int64_t i0 = v * L;
    if (W == 4 && i0 + L <= m) {  // Kimi's width: deinterleave [L, 4] and [L, 3] directly
      VF w0, w1, w2, w3, s0, s1, s2;
      hn::LoadInterleaved4(d, weight + (c0 + i0) * 4, w0, w1, w2, w3);
      hn::LoadInterleaved3(d, state + (c0 + i0) * 3, s0, s1, s2);
      hn::Store(w0, d, wt[0] + i0);
      hn::Store(w1, d, wt[1] + i0);
      hn::Store(w2, d, wt[2] + i0);
      hn::Store(w3, d, wt[3] + i0);
      hn::Store(s0, d, ring[1] + i0);
      hn::Store(s1, d, ring[2] + i0);
      hn::Store(s2, d, ring[3] + i0);
      continue;
    }
    for (int64_t i = i0; i < i0 + L; ++i) {
      const bool live = i < m;
      for (int j = 0; j < W; ++j) {
        wt[j][i] = live ? weight[(c0 + i) * W + j] : 0.0f;
        ring[j][i] = 0.0f;
      }
      for (int j = 0; j < hist; ++j) ring[j + 1][i] = live ? state[(c0 + i) * hist + j] : 0.0f;
    }
  }
  for (int64_t t = 0; t < T; ++t) {
    const float* win[kMaxConvWidth];
    for (int j = 0; j < W; ++j) win[j] = ring[(t + 1 + j) % W];
    float* cur_row = ring[t % W];
    for (int64_t i0 = 0; i0 < m; i0 += L) {
      const float* xt = x + t * C + c0 + i0;
      float* yt = y + t * C + c0 + i0;
      const bool full = i0 + L <= m;
      const VF cur = full ? hn::LoadU(d, xt) : LoadTail(d, xt, static_cast<size_t>(m - i0));
      hn::Store(cur, d, cur_row + i0);  // read before the (possibly aliased) store below
      VF acc = hn::Zero(d);
      for (int j = 0; j < hist; ++j)
        acc = hn::Add(acc, hn::Mul(hn::Load(d, wt[j] + i0), hn::Load(d, win[j] + i0)));
      acc = hn::Add(acc, hn::Mul(hn::Load(d, wt[hist] + i0), cur));
      const VF out = SiluVec(d, acc);
      if (full) {
        hn::StoreU(out, d, yt);
      } else {
        StoreTail(d, out, yt, static_cast<size_t>(m - i0));
      }
    }
  }
  for (int64_t v = 0; v < nv; ++v) {
    const int64_t i0 = v * L;
    const float* r[kMaxConvWidth];
    for (int j = 0; j < hist; ++j) r[j] = ring[(T + 1 + j) % W];
    if (W == 4 && i0 + L <= m) {
      hn::StoreInterleaved3(hn::Load(d, r[0] + i0), hn::Load(d, r[1] + i0), hn::Load(d, r[2] + i0),
                            d, state + (c0 + i0) * 3);
      continue;
    }
    for (int64_t i = i0; i < std::min(i0 + L, m); ++i)
      for (int j = 0; j < hist; ++j) state[(c0 + i) * hist + j] = r[j][i];
  }
}

// Channels [c_begin, c_end) of every token, in tiles.
void CausalConv1dSilu(const float* x, int64_t T, int64_t C, int64_t c_begin, int64_t c_end,
                      const float* weight, int W, float* state, float* y) {
  const int64_t tile = kTileVecs * static_cast<int64_t>(hn::Lanes(DF()));
  for (int64_t c0 = c_begin; c0 < c_end; c0 += tile)
    ConvTile(x, T, C, c0, std::min(tile, c_end - c0), weight, W, state, y);
}

// Rows [row_begin, row_end) of [T * H] (token, head) rows of dk channels.
void KdaGate(const float* f, int64_t row_begin, int64_t row_end, int64_t H, int64_t dk,
             const float* a_log, const float* dt_bias, bool has_lower_bound, float lower_bound,
             float* g) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t row = row_begin; row < row_end; ++row) {
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

bool causal_conv1d_silu_splits(int64_t T, int64_t C, int W) {
  return T * C * W > kParallelMinWork && parallel_threads() > 1;
}

void causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* weight, int W,
                        float* state, float* y) {
  assert(W >= 1 && W <= kMaxConvWidth);
  // Threads take ranges of whole granules of channels (a multiple of every target's tile);
  // a channel's values do not depend on which tile or thread computes it.
  constexpr int64_t kGranule = 256;
  const int64_t granules = (C + kGranule - 1) / kGranule;
  parallel_ranges(granules, causal_conv1d_silu_splits(T, C, W), [&](int64_t g0, int64_t g1) {
    HWY_DYNAMIC_DISPATCH(CausalConv1dSilu)
    (x, T, C, g0 * kGranule, std::min(C, g1 * kGranule), weight, W, state, y);
  });
}

void kda_gate(const float* f, int64_t T, int64_t H, int64_t dk, const float* a_log,
              const float* dt_bias, std::optional<float> lower_bound, float* g) {
  parallel_ranges(T * H, T * H * dk > kParallelMinWork, [&](int64_t r0, int64_t r1) {
    HWY_DYNAMIC_DISPATCH(KdaGate)
    (f, r0, r1, H, dk, a_log, dt_bias, lower_bound.has_value(), lower_bound.value_or(0.0f), g);
  });
}

}  // namespace attnres
#endif  // HWY_ONCE
