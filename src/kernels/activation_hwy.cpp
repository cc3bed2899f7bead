// SiTU (activation.h) with Highway runtime dispatch: situf()'s function evaluated in f32 vectors
// with Highway's Expm1 and Exp instead of libm's tanhf/expf.
//
// Numerics: every element goes through the same vector function whatever its position (the
// ragged end of the array is computed in a zero-padded vector), so a value depends only on its
// (gate, up) pair and the target: bitwise the same in a decode and a prefill call and for any
// thread count. The two tanh are sign(x) A / (A + 2) with A = expm1(2 |x|) (the arguments scaled
// by 2 / b and 2 / bl) and share one division, the sigmoid is 1 / (1 + exp(-g)): two divisions
// an element instead of situf()'s five, 1.15-1.2x faster (BM_RowsSitu). Against the scalar twin
// situ_ref() (libm) the largest difference over 4M random (g, u) (normal and wide, as in the
// test) is 5.3 ulp of the result, as with Highway's Tanh and true divisions; the test in
// tests/unit/kernels/test_activation.cpp bounds it by 16 ulp.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/activation_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/activation.h"
#include "kernels/rowops_hwy-inl.h"
#include "util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

HWY_INLINE VF SituVec(DF d, VF g, VF u, VF b, VF bl, VF two_over_b, VF two_over_bl) {
  const VF one = hn::Set(d, 1.0f), two = hn::Set(d, 2.0f);
  // tanh(x) = sign(x) A / (A + 2) with A = expm1(2 |x|), saturated to 1 beyond |2x| = 40
  // (A > 2e17: A / (A + 2) rounds to 1); the two tanh share one division.
  const VF limit2 = hn::Set(d, 40.0f);
  const VF sg = hn::And(hn::SignBit(d), g), su = hn::And(hn::SignBit(d), u);
  const VF ag = hn::Min(hn::Mul(hn::Xor(g, sg), two_over_b), limit2);
  const VF au = hn::Min(hn::Mul(hn::Xor(u, su), two_over_bl), limit2);
  const VF A = hn::Expm1(d, ag), C = hn::Expm1(d, au);
  const VF tanh_prod =
      hn::Div(hn::Mul(A, C), hn::Mul(hn::Add(A, two), hn::Add(C, two)));  // |tanh tanh|
  // Highway's Exp is defined up to ~88.7 (where expf overflows to inf and 1 / (1 + inf) = 0):
  // beyond 88 the sigmoid is flushed to 0 (libm gives 0 or a value below 1e-38 there).
  const VF neg_g = hn::Neg(g);
  const VF limit = hn::Set(d, 88.0f);
  const VF sig = hn::IfThenZeroElse(hn::Gt(neg_g, limit),
                                    hn::Div(one, hn::Add(one, hn::Exp(d, hn::Min(neg_g, limit)))));
  const VF y = hn::Xor(hn::Mul(hn::Mul(hn::Mul(b, bl), tanh_prod), sig), hn::Xor(sg, su));
  // The clamps (Min) drop a NaN input; it is a NaN result, as in situf().
  return hn::IfThenElse(hn::Or(hn::IsNaN(g), hn::IsNaN(u)), hn::Add(g, u), y);
}

// out[i] = SiTU(gate[i], up[i]) for i < n, rounded in the vector as round_bf16 with bf16_out
// (always for bf16 out); f32 out may alias gate or up (each vector is loaded before it is stored).
template <typename T>
HWY_INLINE void SituSpanT(const float* gate, const float* up, int64_t n, float beta,
                          float linear_beta, bool bf16_out, T* out) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF b = hn::Set(d, beta), bl = hn::Set(d, linear_beta);
  const VF tb = hn::Set(d, 2.0f / beta), tbl = hn::Set(d, 2.0f / linear_beta);
  auto f = [&](VF g, VF u) {
    const VF v = SituVec(d, g, u, b, bl, tb, tbl);
    return bf16_out || std::is_same_v<T, bf16> ? CastT<bf16>(d, v) : v;
  };
  int64_t i = 0;
  for (; i + L <= n; i += L) StoreT(d, f(hn::LoadU(d, gate + i), hn::LoadU(d, up + i)), out + i);
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    StoreTail(d, f(LoadTail(d, gate + i, rest), LoadTail(d, up + i, rest)), out + i, rest);
  }
}
void SituSpan(const float* gate, const float* up, int64_t n, float beta, float linear_beta,
              bool bf16_out, float* out) {
  SituSpanT(gate, up, n, beta, linear_beta, bf16_out, out);
}
void SituSpanBf16(const float* gate, const float* up, int64_t n, float beta, float linear_beta,
                  bf16* out) {
  SituSpanT(gate, up, n, beta, linear_beta, true, out);
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(SituSpan);
HWY_EXPORT(SituSpanBf16);

namespace {

// span(i0, m) over [0, n) in blocks of m elements.
template <typename Span>
void situ_blocks(int64_t n, const Span& span) {
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
      span(i0, m);
    }
  });
}

}  // namespace

void situ(const float* gate, const float* up, int64_t n, float beta, float linear_beta,
          bool bf16_out, float* out) {
  situ_blocks(n, [&](int64_t i0, int64_t m) {
    HWY_DYNAMIC_DISPATCH(SituSpan)(gate + i0, up + i0, m, beta, linear_beta, bf16_out, out + i0);
  });
}

void situ(const float* gate, const float* up, int64_t n, float beta, float linear_beta, bf16* out) {
  situ_blocks(n, [&](int64_t i0, int64_t m) {
    HWY_DYNAMIC_DISPATCH(SituSpanBf16)(gate + i0, up + i0, m, beta, linear_beta, out + i0);
  });
}

}  // namespace attnres
#endif  // HWY_ONCE
