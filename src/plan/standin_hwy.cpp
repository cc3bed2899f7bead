// Dispatched stand-in sublayer kernel (standin.h).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "plan/standin_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>
#include <cstdint>

#include "kernels/attnres.h"
#include "kernels/bf16_hwy-inl.h"
#include "plan/standin.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <typename T, bool kMlp>
void Apply(const T* in, T* out, int64_t rows, int64_t d, float a, float b, const float* c) {
#pragma omp parallel for schedule(static) if (rows * d >= kAttnResParallelMinElements)
  for (int64_t t = 0; t < rows; ++t) {
    const DF df;
    const int64_t N = static_cast<int64_t>(hn::Lanes(df));
    const T* x_row = in + t * d;
    T* y_row = out + t * d;
    const VF va = hn::Set(df, a), vb = hn::Set(df, b), one = hn::Set(df, 1.0f);
    int64_t j = 0;
    for (; j + N <= d; j += N) {
      const VF x = LoadF(df, x_row + j);
      const VF s = hn::Div(x, hn::Add(one, hn::Abs(x)));
      const VF cj = hn::LoadU(df, c + j);
      VF y;
      if constexpr (kMlp) {
        y = hn::Add(hn::Mul(x, hn::Add(va, hn::Mul(vb, s))), cj);
      } else {
        y = hn::Add(hn::Add(hn::Mul(va, x), hn::Mul(vb, s)), cj);
      }
      StoreT(df, CastT<T>(df, y), y_row + j);
    }
    for (; j < d; ++j) {
      const float x = WidenS(x_row[j]);
      const float s = x / (1.0f + std::fabs(x));
      const float y = kMlp ? x * (a + b * s) + c[j] : (a * x + b * s) + c[j];
      y_row[j] = NarrowS<T>(y);
    }
  }
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
