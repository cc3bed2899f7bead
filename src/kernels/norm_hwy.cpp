// rms_norm, l2_norm and gated_rms_norm (norm.h) with Highway runtime dispatch.
//
// Numerics against the scalar twins (norm.cpp): the sum of squares of a row is lane-parallel
// (SumSquares in rowops_hwy-inl.h: an order fixed by D and the target), so it may differ from
// the sequential sum by reordering; with sums that are exact in f32 the outputs are bitwise the
// twins'. The rsqrt is the twins' scalar expression; the per-element steps are the same IEEE
// operations in the same order (x * inv, bf16 rounding, * gain, bf16 rounding; gated:
// ((o * inv) * gain) * sigmoid(gate), the sigmoid via Highway's Exp, <= 1 ulp).
//
// Threads: ranges of rows (parallel_ranges: one dispatched call per range, from
// target-independent code); each row is computed by one thread, and nothing in a row's arithmetic
// depends on which rows share a thread, so results are independent of the thread count. The ragged
// end of a row goes through the same vector code in a zero-padded vector (zeros add nothing to the
// sum of squares).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/norm_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cassert>
#include <cmath>
#include <cstdint>

#include "kernels/norm.h"
#include "kernels/parallel.h"
#include "kernels/rowops_hwy-inl.h"
#include "util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Which gain a row kernel reads: none (gain 1), F32 or BF16.
enum class GainKind : int { kNone = 0, kF32 = 1, kBF16 = 2 };

// y = (x * inv) [bf16] * gain [bf16] for one row of D; G is the gain's storage type.
template <typename G>
HWY_INLINE void ScaleRow(DF d, const float* x, int64_t D, float inv, const G* gain, bool bf16_out,
                         float* y) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF vinv = hn::Set(d, inv);
  auto step = [&](VF xv, VF gv) {
    VF v = hn::Mul(xv, vinv);
    if (bf16_out) v = CastT<bf16>(d, v);
    if (gain != nullptr) v = hn::Mul(v, gv);
    return bf16_out ? CastT<bf16>(d, v) : v;
  };
  int64_t i = 0;
  for (; i + L <= D; i += L) {
    const VF gv = gain != nullptr ? LoadF(d, gain + i) : hn::Zero(d);
    hn::StoreU(step(hn::LoadU(d, x + i), gv), d, y + i);
  }
  if (i < D) {
    const size_t rest = static_cast<size_t>(D - i);
    const VF gv = gain != nullptr ? LoadTail(d, gain + i, rest) : hn::Zero(d);
    StoreTail(d, step(LoadTail(d, x + i, rest), gv), y + i, rest);
  }
}

template <typename G>
void RmsNormRowsT(const float* x, int64_t rows, int64_t D, const G* gain, float eps, bool bf16_out,
                  float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const DF d;
    const float ss = SumSquares(d, x + r * D, D);
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
    ScaleRow(d, x + r * D, D, inv, gain, bf16_out, y + r * D);
  }
}

void RmsNormRows(const float* x, int64_t rows, int64_t D, const void* gain, int gain_kind,
                 float eps, bool bf16_out, float* y) {
  if (static_cast<GainKind>(gain_kind) == GainKind::kBF16) {
    RmsNormRowsT(x, rows, D, static_cast<const bf16*>(gain), eps, bf16_out, y);
  } else {
    RmsNormRowsT(x, rows, D, static_cast<const float*>(gain), eps, bf16_out, y);
  }
}

void L2NormRows(const float* x, int64_t rows, int64_t D, float eps, float scale, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const DF d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    const float* xr = x + r * D;
    float* yr = y + r * D;
    const float inv = 1.0f / std::sqrt(SumSquares(d, xr, D) + eps);
    const VF vinv = hn::Set(d, inv), vscale = hn::Set(d, scale);
    int64_t i = 0;
    for (; i + L <= D; i += L)
      hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, xr + i), vinv), vscale), d, yr + i);
    if (i < D) {
      const size_t rest = static_cast<size_t>(D - i);
      StoreTail(d, hn::Mul(hn::Mul(LoadTail(d, xr + i, rest), vinv), vscale), yr + i, rest);
    }
  }
}

template <typename G>
void GatedRmsNormRowsT(const float* o, const float* gate, int64_t rows, int64_t D, const G* gain,
                       float eps, bool bf16_out, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const DF d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    const float* orow = o + r * D;
    const float* grow = gate + r * D;
    float* yr = y + r * D;
    const float inv = 1.0f / std::sqrt(SumSquares(d, orow, D) / static_cast<float>(D) + eps);
    const VF vinv = hn::Set(d, inv);
    auto step = [&](VF ov, VF gv, VF wv) {
      const VF v = hn::Mul(hn::Mul(hn::Mul(ov, vinv), wv), SigmoidVec(d, gv));
      return bf16_out ? CastT<bf16>(d, v) : v;
    };
    int64_t i = 0;
    for (; i + L <= D; i += L)
      hn::StoreU(step(hn::LoadU(d, orow + i), hn::LoadU(d, grow + i), LoadF(d, gain + i)), d,
                 yr + i);
    if (i < D) {
      const size_t rest = static_cast<size_t>(D - i);
      StoreTail(d,
                step(LoadTail(d, orow + i, rest), LoadTail(d, grow + i, rest),
                     LoadTail(d, gain + i, rest)),
                yr + i, rest);
    }
  }
}

void GatedRmsNormRows(const float* o, const float* gate, int64_t rows, int64_t D, const void* gain,
                      int gain_kind, float eps, bool bf16_out, float* y) {
  if (static_cast<GainKind>(gain_kind) == GainKind::kBF16) {
    GatedRmsNormRowsT(o, gate, rows, D, static_cast<const bf16*>(gain), eps, bf16_out, y);
  } else {
    GatedRmsNormRowsT(o, gate, rows, D, static_cast<const float*>(gain), eps, bf16_out, y);
  }
}

void RoundToBf16(float* x, int64_t n) {
  RoundSpanToBf16(x, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(RmsNormRows);
HWY_EXPORT(L2NormRows);
HWY_EXPORT(GatedRmsNormRows);
HWY_EXPORT(RoundToBf16);

namespace {
// GainKind of a view (the enum lives per target; its values are fixed above).
int gain_kind(const TensorView& g) {
  if (g.data == nullptr) return 0;
  assert(g.dtype == DType::kF32 || g.dtype == DType::kBF16);
  return g.dtype == DType::kBF16 ? 2 : 1;
}
}  // namespace

void rms_norm(const float* x, int64_t rows, int64_t D, const TensorView& gain, float eps,
              bool bf16_out, float* y) {
  const int kind = gain_kind(gain);
  parallel_ranges(rows, rows * D > kParallelMinWork, [&](int64_t r0, int64_t r1) {
    HWY_DYNAMIC_DISPATCH(RmsNormRows)
    (x + r0 * D, r1 - r0, D, gain.data, kind, eps, bf16_out, y + r0 * D);
  });
}

void l2_norm(const float* x, int64_t rows, int64_t D, float eps, float scale, float* y) {
  parallel_ranges(rows, rows * D > kParallelMinWork, [&](int64_t r0, int64_t r1) {
    HWY_DYNAMIC_DISPATCH(L2NormRows)(x + r0 * D, r1 - r0, D, eps, scale, y + r0 * D);
  });
}

void gated_rms_norm(const float* o, const float* gate, int64_t rows, int64_t D,
                    const TensorView& gain, float eps, bool bf16_out, float* y) {
  assert(gain.data != nullptr);
  const int kind = gain_kind(gain);
  parallel_ranges(rows, rows * D > kParallelMinWork, [&](int64_t r0, int64_t r1) {
    HWY_DYNAMIC_DISPATCH(GatedRmsNormRows)
    (o + r0 * D, gate + r0 * D, r1 - r0, D, gain.data, kind, eps, bf16_out, y + r0 * D);
  });
}

void round_to_bf16(float* x, int64_t n, bool enabled) {
  if (!enabled) return;
  parallel_ranges(n, n > kParallelMinWork, [&](int64_t i0, int64_t i1) {
    HWY_DYNAMIC_DISPATCH(RoundToBf16)(x + i0, i1 - i0);
  });
}

}  // namespace attnres
#endif  // HWY_ONCE
