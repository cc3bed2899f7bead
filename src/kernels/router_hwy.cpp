// route_sigmoid_topk (router.h) with Highway runtime dispatch.
//
// Per token: the E sigmoid scores are computed in vectors (SigmoidVec: the twin's
// 1 / (1 + exp(-x)) with Highway's Exp) and kept in scratch; the biased scores s + bias (the
// twin's f32 add) are offered to a top-k list in one pass over increasing expert id. The list
// is kept sorted by descending biased score; a new expert moves ahead only of strictly smaller
// scores and enters a full list only with a score strictly above the k-th, so among equal
// scores the lower id stays first: the order of route_sigmoid_topk_ref's k argmax passes
// (strict > over increasing id). A vector of scores none of which beats the current k-th is
// skipped with one compare. The weights are then formed exactly as in the twin (same values,
// same sequential sum, same division and scaling), so for identical scores ids and weights are
// bitwise identical; the scores themselves differ from libm's by the Exp ulp bound.
//
// Threads: ranges of tokens (parallel_ranges), each token on one thread; nothing depends on the
// split.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/router_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <bit>
#include <cassert>
#include <cstdint>

#include "kernels/parallel.h"
#include "kernels/router.h"
#include "kernels/rowops_hwy-inl.h"
#include "util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Offers expert e with biased score s to the list top/ids [n of K], sorted by (score desc,
// id asc); experts are offered in increasing id.
HWY_INLINE void Offer(int64_t e, float s, int64_t K, int64_t& n, float* top, int32_t* ids) {
  int64_t pos;
  if (n == K) {
    if (!(s > top[K - 1])) return;
    pos = K - 1;
  } else {
    pos = n++;
  }
  for (; pos > 0 && top[pos - 1] < s; --pos) {
    top[pos] = top[pos - 1];
    ids[pos] = ids[pos - 1];
  }
  top[pos] = s;
  ids[pos] = static_cast<int32_t>(e);
}

void RouteTokens(const float* logits, const float* bias, int64_t T, int64_t E, int64_t K,
                 bool renormalize, float scaling, bool bias_in_weights, int32_t* ids,
                 float* weights, float* scratch) {
  for (int64_t t = 0; t < T; ++t) {
    const DF d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    const float* lt = logits + t * E;  // [E]
    float* sig = scratch + t * E;      // [E] unbiased scores
    int32_t* it = ids + t * K;         // [K]
    float* top = weights + t * K;      // [K] biased scores of the list, then the weights
    int64_t n = 0;
    HWY_ALIGN float lanes[hn::MaxLanes(DF())];
    // Offers experts [e, e + m), m <= L, whose biased scores are the first m lanes of bv.
    // Once the list is full only lanes above the current k-th score can enter; they are
    // offered in increasing lane order (Offer rechecks against the rising k-th score).
    auto offer_vector = [&](int64_t e, int64_t m, VF bv) {
      if (n < K) {
        hn::Store(bv, d, lanes);
        for (int64_t l = 0; l < m; ++l) Offer(e + l, lanes[l], K, n, top, it);
        return;
      }
      const auto above = hn::Gt(bv, hn::Set(d, top[K - 1]));
      if (hn::AllFalse(d, above)) return;
      uint8_t mask_bytes[8] = {};
      hn::StoreMaskBits(d, above, mask_bytes);
      uint64_t bits = 0;  // bit l = lane l
      for (int k = 0; k < 8; ++k) bits |= uint64_t{mask_bytes[k]} << (8 * k);
      if (m < 64) bits &= (uint64_t{1} << m) - 1;
      hn::Store(bv, d, lanes);
      for (; bits != 0; bits &= bits - 1) {
        const int l = std::countr_zero(bits);
        Offer(e + l, lanes[l], K, n, top, it);
      }
    };
    int64_t e = 0;
    for (; e + L <= E; e += L) {
      const VF sv = SigmoidVec(d, hn::LoadU(d, lt + e));
      hn::StoreU(sv, d, sig + e);
      offer_vector(e, L, bias != nullptr ? hn::Add(sv, hn::LoadU(d, bias + e)) : sv);
    }
    if (e < E) {
      const size_t rest = static_cast<size_t>(E - e);
      const VF sv = SigmoidVec(d, LoadTail(d, lt + e, rest));
      StoreTail(d, sv, sig + e, rest);
      // Padded lanes are never offered (m = rest), whatever their score.
      offer_vector(e, E - e, bias != nullptr ? hn::Add(sv, LoadTail(d, bias + e, rest)) : sv);
    }
    float sum = 0.0f;
    for (int64_t s = 0; s < K; ++s) {
      top[s] = bias_in_weights ? top[s] : sig[it[s]];
      sum += top[s];
    }
    for (int64_t s = 0; s < K; ++s) {
      if (renormalize) top[s] = top[s] / (sum + 1e-20f);
      top[s] *= scaling;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(RouteTokens);

void route_sigmoid_topk(const float* logits, const float* bias, int64_t T, int64_t E,
                        const RouterOptions& opt, int32_t* ids, float* weights, float* scratch) {
  assert(opt.top_k >= 1 && opt.top_k <= E);
  const int64_t K = opt.top_k;
  parallel_ranges(T, T * E * K > kParallelMinWork, [&](int64_t t0, int64_t t1) {
    HWY_DYNAMIC_DISPATCH(RouteTokens)
    (logits + t0 * E, bias, t1 - t0, E, K, opt.renormalize, opt.scaling, opt.bias_in_weights,
     ids + t0 * K, weights + t0 * K, scratch + t0 * E);
  });
}

}  // namespace attnres
#endif  // HWY_ONCE
