// Dispatched stand-in sublayer kernel (standin.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "plan/standin_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/attnres.h"
#include "kernels/bf16_hwy-inl.h"
#include "plan/standin.h"
#include "util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <bool kMlp>
HWY_INLINE VF Formula(DF df, VF x, VF a, VF b, VF c) {
  const VF s = hn::Min(hn::Max(x, hn::Set(df, -1.0f)), hn::Set(df, 1.0f));
  if constexpr (kMlp) {
    return hn::Add(hn::Mul(x, hn::Add(a, hn::Mul(b, s))), c);
  } else {
    return hn::Add(hn::Add(hn::Mul(a, x), hn::Mul(b, s)), c);
  }
}

template <bool kMlp>
inline float FormulaS(float x, float a, float b, float c) {
  const float s = std::min(std::max(x, -1.0f), 1.0f);
  return kMlp ? x * (a + b * s) + c : (a * x + b * s) + c;
}

template <typename T, bool kMlp>
void Apply(const T* in, T* out, int64_t rows, int64_t d, float a, float b, const float* c) {
  parallel_ranges(
      rows, rows * d >= kAttnResParallelMinElements, [&](int64_t t_begin, int64_t t_end) {
        for (int64_t t = t_begin; t < t_end; ++t) {
          const DF df;
          const int64_t N = static_cast<int64_t>(hn::Lanes(df));
          const T* x_row = in + t * d;
          T* y_row = out + t * d;
          const VF va = hn::Set(df, a), vb = hn::Set(df, b);
          int64_t j = 0;
#if HWY_TARGET != HWY_SCALAR
          if constexpr (std::is_same_v<T, bf16>) {
            // 2N bf16 at a time split into even/odd elements by a shift and a mask (no widening
            // shuffles); the offsets are split to match.
            const DU du;
            const hn::Repartition<uint16_t, DF> d16;
            const auto hi_mask = hn::Set(du, 0xffff0000u);
            for (; j + 2 * N <= d; j += 2 * N) {
              const auto r =
                  hn::BitCast(du, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(x_row + j)));
              const VF ca = hn::LoadU(df, c + j), cb = hn::LoadU(df, c + j + N);
              const VF ye = CastT<T>(df, Formula<kMlp>(df, hn::BitCast(df, hn::ShiftLeft<16>(r)),
                                                       va, vb, hn::ConcatEven(df, cb, ca)));
              const VF yo = CastT<T>(df, Formula<kMlp>(df, hn::BitCast(df, hn::And(r, hi_mask)), va,
                                                       vb, hn::ConcatOdd(df, cb, ca)));
              const auto packed = hn::Or(hn::And(hn::BitCast(du, yo), hi_mask),
                                         hn::ShiftRight<16>(hn::BitCast(du, ye)));
              hn::StoreU(hn::BitCast(d16, packed), d16, reinterpret_cast<uint16_t*>(y_row + j));
            }
          }
#endif
          for (; j + N <= d; j += N) {
            const VF y = Formula<kMlp>(df, LoadF(df, x_row + j), va, vb, hn::LoadU(df, c + j));
            StoreT(df, CastT<T>(df, y), y_row + j);
          }
          for (; j < d; ++j)
            y_row[j] = f32_to_storage<T>(FormulaS<kMlp>(storage_to_f32(x_row[j]), a, b, c[j]));
        }
      });
}

void StandInBf16(const bf16* in, bf16* out, int64_t rows, int64_t d, int kind, float a, float b,
                 const float* c) {
  if (kind == 1) {
    Apply<bf16, true>(in, out, rows, d, a, b, c);
  } else {
    Apply<bf16, false>(in, out, rows, d, a, b, c);
  }
}
void StandInF32(const float* in, float* out, int64_t rows, int64_t d, int kind, float a, float b,
                const float* c) {
  if (kind == 1) {
    Apply<float, true>(in, out, rows, d, a, b, c);
  } else {
    Apply<float, false>(in, out, rows, d, a, b, c);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(StandInBf16);
HWY_EXPORT(StandInF32);

void standin_elementwise(const ActView& in, const ActView& out, StandInKind kind, float a, float b,
                         const float* offset) {
  const int k = kind == StandInKind::kMlp ? 1 : 0;
  if (out.dtype == ActDType::kBF16) {
    HWY_DYNAMIC_DISPATCH(StandInBf16)
    (in.bf16_data(), out.bf16_data(), out.tokens, out.dim, k, a, b, offset);
  } else {
    HWY_DYNAMIC_DISPATCH(StandInF32)
    (in.f32_data(), out.f32_data(), out.tokens, out.dim, k, a, b, offset);
  }
}

}  // namespace attnres
#endif  // HWY_ONCE
