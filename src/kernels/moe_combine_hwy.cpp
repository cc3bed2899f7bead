// moe_combine (moe_combine.h) with Highway runtime dispatch: tiles of kCombineNV vectors of y
// in registers while every slot's row adds its weighted terms (Mul, then Add: this file is
// compiled with -ffp-contract=off), then the vectors left, then the ragged end in 1-lane
// vectors of the same target; each element's sequence is the twin's.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/moe_combine_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstdint>

#include "kernels/moe_combine.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kCombineNV = 4;

// Columns [i, i + NV * Lanes(d)) of y.
template <int NV, class D>
HWY_INLINE void CombineTile(D d, const float* x, int64_t ldx, const int64_t* rows, const float* w,
                            int64_t k, int64_t i, float* y) {
  using V = hn::Vec<D>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  V acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = hn::LoadU(d, y + i + v * L);
  for (int64_t s = 0; s < k; ++s) {
    const V ws = hn::Set(d, w[s]);
    const float* xs = x + rows[s] * ldx + i;
    for (int v = 0; v < NV; ++v) acc[v] = hn::Add(acc[v], hn::Mul(ws, hn::LoadU(d, xs + v * L)));
  }
  for (int v = 0; v < NV; ++v) hn::StoreU(acc[v], d, y + i + v * L);
}

void MoeCombine(const float* x, int64_t ldx, const int64_t* rows, const float* w, int64_t k,
                int64_t n, float* y) {
  const hn::ScalableTag<float> d;
  const hn::CappedTag<float, 1> d1;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + kCombineNV * L <= n; i += kCombineNV * L)
    CombineTile<kCombineNV>(d, x, ldx, rows, w, k, i, y);
  for (; i + L <= n; i += L) CombineTile<1>(d, x, ldx, rows, w, k, i, y);
  for (; i < n; ++i) CombineTile<1>(d1, x, ldx, rows, w, k, i, y);
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(MoeCombine);

void moe_combine(const float* x, int64_t ldx, const int64_t* rows, const float* w, int64_t k,
                 int64_t n, float* y) {
  HWY_DYNAMIC_DISPATCH(MoeCombine)(x, ldx, rows, w, k, n, y);
}

}  // namespace attnres
#endif  // HWY_ONCE
