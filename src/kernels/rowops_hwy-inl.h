// Vector pieces shared by the dispatched row kernels (norm_hwy.cpp, router_hwy.cpp,
// conv_gate_hwy.cpp, silu_hwy.cpp): the logistic sigmoid, SiLU and softplus in f32 vectors with
// Highway's Exp (<= 1 ulp) and Log1p (<= 2 ulp), zero-padded loads/stores for the ragged end of
// a row, and a sum of squares in a fixed order.
//
// Each function is lane-wise (a lane's result depends only on that lane's inputs), so a value
// computed in the ragged end's padded vector equals the one it would get in a full vector:
// element-wise kernels are independent of an element's position and of the thread split.
// The formulas and their operation order follow the scalar twins (activation.h sigmoidf/siluf,
// kda_gate_ref's softplus); only exp/log1p differ, by their ulp bounds.
//
// Per-target include guard (Highway's -inl.h convention): include after <hwy/highway.h> inside
// a file compiled once per target by foreach_target.h.
#if defined(ATTNRES_KERNELS_ROWOPS_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNRES_KERNELS_ROWOPS_HWY_INL_H_
#undef ATTNRES_KERNELS_ROWOPS_HWY_INL_H_
#else
#define ATTNRES_KERNELS_ROWOPS_HWY_INL_H_
#endif

#include <hwy/highway.h>

#include <hwy/contrib/math/math-inl.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/bf16_hwy-inl.h"
#include "util/numeric.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// exp(x) for the denominators 1 + exp(-x). Highway's Exp is specified on [-FLT_MAX, 104] and
// returns +inf above ~88.72 like expf (the tests check both edges); beyond 104 it is undefined,
// so larger arguments are replaced by 104 (still +inf). A NaN argument is left as it is.
HWY_INLINE VF ExpUpTo104(DF d, VF x) {
  const VF hi = hn::Set(d, 104.0f);
  return hn::Exp(d, hn::IfThenElse(hn::Gt(x, hi), hi, x));
}

// sigmoidf(x) = 1 / (1 + exp(-x)): 1 for large x (exp(-x) -> 0), 0 for x < -88.72 (1 / inf).
HWY_INLINE VF SigmoidVec(DF d, VF x) {
  const VF one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, ExpUpTo104(d, hn::Neg(x))));
}

// siluf(x) = x / (1 + exp(-x)): -0 for x < -88.72, as x / inf.
HWY_INLINE VF SiluVec(DF d, VF x) {
  return hn::Div(x, hn::Add(hn::Set(d, 1.0f), ExpUpTo104(d, hn::Neg(x))));
}

// softplus with torch's threshold: z above 20, else log1p(exp(z)) (exp(z) <= e^20, no
// overflow; Log1p's domain [0, FLT_MAX] holds since exp(z) >= 0).
HWY_INLINE VF SoftplusVec(DF d, VF z) {
  const VF th = hn::Set(d, 20.0f);
  const auto above = hn::Gt(z, th);
  return hn::IfThenElse(above, z, hn::Log1p(d, hn::Exp(d, hn::IfThenElse(above, th, z))));
}

// n < Lanes(d) values into a zero-padded vector; reads nothing past p + n.
HWY_INLINE VF LoadTail(DF d, const float* p, size_t n) {
  HWY_ALIGN float buf[hn::MaxLanes(DF())] = {};
  std::memcpy(buf, p, n * sizeof(float));
  return hn::Load(d, buf);
}
HWY_INLINE VF LoadTail(DF d, const bf16* p, size_t n) {
  bf16 buf[hn::MaxLanes(DF())] = {};
  std::memcpy(buf, p, n * sizeof(bf16));
  return LoadF(d, buf);
}
// The first n < Lanes(d) lanes of v to p; writes nothing past p + n. To bf16: v already cast by
// CastT<bf16>.
HWY_INLINE void StoreTail(DF d, VF v, float* p, size_t n) {
  HWY_ALIGN float buf[hn::MaxLanes(DF())];
  hn::Store(v, d, buf);
  std::memcpy(p, buf, n * sizeof(float));
}
HWY_INLINE void StoreTail(DF d, VF v, bf16* p, size_t n) {
  bf16 buf[hn::MaxLanes(DF())];
  StoreT(d, v, buf);
  std::memcpy(p, buf, n * sizeof(bf16));
}

// sum(x[i]^2) over n values in a fixed order that depends only on n and the target: four
// vector accumulators take consecutive vectors in turn (fused multiply-add where the target
// has it), the remaining whole vectors go to a0, the zero-padded ragged end to a1; then
// (a0 + a1) + (a2 + a3), whose lanes are added in increasing lane order.
HWY_INLINE float SumSquares(DF d, const float* x, int64_t n) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    const VF x0 = hn::LoadU(d, x + i), x1 = hn::LoadU(d, x + i + L);
    const VF x2 = hn::LoadU(d, x + i + 2 * L), x3 = hn::LoadU(d, x + i + 3 * L);
    a0 = hn::MulAdd(x0, x0, a0);
    a1 = hn::MulAdd(x1, x1, a1);
    a2 = hn::MulAdd(x2, x2, a2);
    a3 = hn::MulAdd(x3, x3, a3);
  }
  for (; i + L <= n; i += L) {
    const VF v = hn::LoadU(d, x + i);
    a0 = hn::MulAdd(v, v, a0);
  }
  if (i < n) {
    const VF v = LoadTail(d, x + i, static_cast<size_t>(n - i));
    a1 = hn::MulAdd(v, v, a1);
  }
  HWY_ALIGN float lanes[hn::MaxLanes(DF())];
  hn::Store(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), d, lanes);
  float s = 0.0f;
  for (int64_t l = 0; l < L; ++l) s += lanes[l];
  return s;
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
