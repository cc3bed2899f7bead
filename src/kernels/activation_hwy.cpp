// SiTU (activation.h) with Highway runtime dispatch: the same formula as situf(), evaluated in
// f32 vectors with Highway's Tanh (<= 4 ulp) and Exp (<= 1 ulp) instead of libm's tanhf/expf.
//
// Numerics: every element goes through the same vector function whatever its position (the
// ragged end of the array is computed in a zero-padded vector), so a value depends only on its
// (gate, up) pair and the target: bitwise the same in a decode and a prefill call and for any
// thread count. Against the scalar twin situ_ref() (libm) the difference is a few ulp of each
// factor; the test in tests/unit/kernels/test_activation.cpp bounds it. The operations and their
// order follow situf(): ((b * tanh(g / b)) * sigmoid(g)) * (bl * tanh(u / bl)), with
// sigmoid(g) = 1 / (1 + exp(-g)) and true divisions by b and bl.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/activation_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/activation.h"
#include "util/numeric.h"
#include "util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

HWY_INLINE VF SituVec(DF d, VF g, VF u, VF b, VF bl) {
  const VF one = hn::Set(d, 1.0f);
  // Highway's Exp is defined up to ~88.7 (where expf overflows to inf and 1 / (1 + inf) = 0):
  // beyond 88 the sigmoid is flushed to 0 (libm gives 0 or a value below 1e-38 there).
  const VF neg_g = hn::Neg(g);
  const VF limit = hn::Set(d, 88.0f);
  const VF sig = hn::IfThenZeroElse(hn::Gt(neg_g, limit),
                                    hn::Div(one, hn::Add(one, hn::Exp(d, hn::Min(neg_g, limit)))));
  const VF capped_g = hn::Mul(b, hn::Tanh(d, hn::Div(g, b)));
  const VF capped_u = hn::Mul(bl, hn::Tanh(d, hn::Div(u, bl)));
  return hn::Mul(hn::Mul(capped_g, sig), capped_u);
}

// out[i] = SiTU(gate[i], up[i]) for i < n; out may alias gate or up (each vector is loaded
// before it is stored).
void SituSpan(const float* gate, const float* up, int64_t n, float beta, float linear_beta,
              float* out) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF b = hn::Set(d, beta), bl = hn::Set(d, linear_beta);
  int64_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(SituVec(d, hn::LoadU(d, gate + i), hn::LoadU(d, up + i), b, bl), d, out + i);
  if (i < n) {
    HWY_ALIGN float g[hn::MaxLanes(DF())] = {};
    HWY_ALIGN float u[hn::MaxLanes(DF())] = {};
    const size_t rest = static_cast<size_t>(n - i);
    std::memcpy(g, gate + i, rest * sizeof(float));
    std::memcpy(u, up + i, rest * sizeof(float));
    hn::Store(SituVec(d, hn::Load(d, g), hn::Load(d, u), b, bl), d, g);
    std::memcpy(out + i, g, rest * sizeof(float));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(SituSpan);

void situ(const float* gate, const float* up, int64_t n, float beta, float linear_beta,
          bool bf16_out, float* out) {
  // Blocks of a fixed size (a multiple of every vector width), so the split over threads never
  // changes which elements share a vector. SiTU costs ~2 ns an element on one core (two tanh,
  // an exponential, a division; BM_RowsSitu), so a decode step's routed experts (8 x 512
  // elements on k3-mini, ~8 us) already repay a parallel region (~1-2 us): the threshold is in
  // elements, not kParallelMinWork.
  constexpr int64_t kBlock = 1024;
  constexpr int64_t kParallelMinElements = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_ranges(blocks, n >= kParallelMinElements, [&](int64_t blk_begin, int64_t blk_end) {
    for (int64_t blk = blk_begin; blk < blk_end; ++blk) {
      const int64_t i0 = blk * kBlock, m = std::min(kBlock, n - i0);
      HWY_DYNAMIC_DISPATCH(SituSpan)(gate + i0, up + i0, m, beta, linear_beta, out + i0);
      if (bf16_out)
        for (int64_t i = i0; i < i0 + m; ++i) out[i] = round_bf16(out[i]);
    }
  });
}

}  // namespace attnres
#endif  // HWY_ONCE
