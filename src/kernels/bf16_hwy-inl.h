// Highway helpers for bf16/f32 storage shared by the dispatched AttnRes kernels: widening
// loads, the storage cast T() (bit-exact with f32_to_bf16: round to nearest even, NaN quieted)
// and narrowing stores. Per-target include guard (Highway's -inl.h convention): include after
// <hwy/highway.h> inside a file compiled once per target by foreach_target.h.
#if defined(ATTNRES_KERNELS_BF16_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNRES_KERNELS_BF16_HWY_INL_H_
#undef ATTNRES_KERNELS_BF16_HWY_INL_H_
#else
#define ATTNRES_KERNELS_BF16_HWY_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <type_traits>

#include "util/numeric.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using DU16 = hn::Rebind<uint16_t, DF>;

// Widening loads: bf16 is the high half of an f32, so widening is a shift (exact).
HWY_INLINE VF LoadF(DF df, const float* p) {
  return hn::LoadU(df, p);
}
HWY_INLINE VF LoadF(DF df, const bf16* p) {
  const DU du;
  const DU16 du16;
  const auto h = hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p));
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, h)));
}

// T(x) kept in f32: for bf16, round to nearest even exactly as f32_to_bf16 (NaN quieted).
template <typename T>
HWY_INLINE VF CastT(DF df, VF v) {
  if constexpr (std::is_same_v<T, bf16>) {
    const DU du;
    const DI di;
    const auto u = hn::BitCast(du, v);
    const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
    const auto hi_mask = hn::Set(du, 0xffff0000u);
    const auto rounded = hn::And(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), lsb)), hi_mask);
    const auto quiet = hn::And(hn::Or(u, hn::Set(du, 0x00400000u)), hi_mask);
    const auto abs_bits = hn::BitCast(di, hn::And(u, hn::Set(du, 0x7fffffffu)));
    const auto is_nan = hn::RebindMask(du, hn::Gt(abs_bits, hn::Set(di, 0x7f800000)));
    return hn::BitCast(df, hn::IfThenElse(is_nan, quiet, rounded));
  } else {
    (void)df;
    return v;
  }
}

// Stores a value already cast by CastT.
HWY_INLINE void StoreT(DF df, VF v, float* p) {
  hn::StoreU(v, df, p);
}
HWY_INLINE void StoreT(DF df, VF v, bf16* p) {
  const DU du;
  const DI di;
  const DU16 du16;
  (void)df;
  const auto hi = hn::BitCast(di, hn::ShiftRight<16>(hn::BitCast(du, v)));
  hn::StoreU(hn::DemoteTo(du16, hi), du16, reinterpret_cast<uint16_t*>(p));
}

// x[i] = round_bf16(x[i]) for i < n, kept in f32 (CastT<bf16> is bit-exact with it); the ragged
// end in scalar.
HWY_INLINE void RoundSpanToBf16(float* x, int64_t n) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(CastT<bf16>(d, hn::LoadU(d, x + i)), d, x + i);
  for (; i < n; ++i) x[i] = round_bf16(x[i]);
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
