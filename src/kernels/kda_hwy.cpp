// KDA recurrent step and chunked prefill (kda.h) with Highway runtime dispatch: one copy per
// compiled target (AVX3 = AVX-512, AVX2, SSE4, SSSE3, SCALAR), chosen once per process from the
// CPU's features; no -march flags. Same functions as the scalar twins kda_recurrent_ref() and
// kda_chunked_ref() (kda.cpp) up to f32 rounding; tests/unit/kernels/test_kda_mla.cpp bounds
// the difference on every target this CPU supports.
//
// Numerics (the contract the tests check):
//  - Every vector operation is lane-wise along the contiguous value (or key) dimension: there is
//    no cross-lane reduction anywhere in this file. A column's value therefore follows one fixed
//    sequence of f32 operations (fused multiply-adds where the target has them) whether it sits
//    in a full vector or in the ragged end (computed in 1-lane vectors of the same target), and
//    whatever the tile it falls in. Sums over a row index run in increasing index, as in the
//    scalar twins. Exponentials use Highway's Exp (<= 1 ulp) instead of libm's.
//  - Each head is processed by exactly one thread (parallel_ranges over heads), so results are
//    bitwise independent of the thread count.
//
// Recurrent step (decode): per head and token the state S [dk, dv] is read twice and written
// once, in column blocks of kRecNV vectors (128 columns on AVX3: whole rows of K3's state):
// pass 1 reads S and forms S^T k of the decayed state in registers (S itself is not written);
// pass 2 recomputes the decayed row, adds k_i delta^T, writes it back and accumulates o = S'^T q
// from the updated rows. A block is at most 64 KiB for dk = 128, so pass 2 re-reads it from L2:
// memory traffic is one read and one write of the state, the minimum. (The twin writes the
// decayed state, then reads S three more times.)
//
// Chunked prefill: the WY / UT algorithm of kda_chunked_ref() step for step (same scratch
// layout, same sub-block factoring of the decay ratios and the same exact fallback), with every
// [rows x dk] x [dk x dv] product, the UT-transform products and the state update done by one
// register-tiled kernel (MatAcc) that keeps a tile of MR rows x NV vectors in registers.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/kda_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>

#include "kernels/kda.h"
#include "kernels/parallel.h"
#include "util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using D1 = hn::CappedTag<float, 1>;  // the ragged end: same operations, one lane

#if HWY_TARGET == HWY_AVX3
constexpr int kMR = 4, kNV = 4;  // 16 accumulators of 32 registers
#else
constexpr int kMR = 4, kNV = 2;  // 8 accumulators of 16 registers
#endif
#if HWY_TARGET == HWY_AVX3
constexpr int kRecNV = 8;  // recurrent column block: kRecNV vectors (2 x kRecNV accumulators)
#else
constexpr int kRecNV = 4;
#endif

// out[i] = exp(x[i] - y[i]) (y may be null: exp(x[i])), vector Exp, tail in 1-lane vectors.
template <class D>
HWY_INLINE void ExpDiffN(D d, const float* x, const float* y, int64_t i, float* out) {
  auto v = hn::LoadU(d, x + i);
  if (y) v = hn::Sub(v, hn::LoadU(d, y + i));
  hn::StoreU(hn::Exp(d, v), d, out + i);
}
HWY_INLINE void ExpDiff(const float* x, const float* y, int64_t n, float* out) {
  const DF d;
  const D1 d1;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L) ExpDiffN(d, x, y, i, out);
  for (; i < n; ++i) ExpDiffN(d1, x, y, i, out);
}

// out[i] = exp(x[i] - y[i]) over the double cumulative gates (y may be null: exp(x[i])), from
// the split exponent of kda_gate_split() (kda.h says why): exp(hi) * (1 + lo) as one fused
// multiply-add. hi and lo are the twin's values exactly (round-to-nearest demotions).
template <class DD>
HWY_INLINE void SplitGates(DD dd, const double* x, const double* y, int64_t i,
                           hn::Vec<hn::Rebind<float, DD>>& hi, hn::Vec<hn::Rebind<float, DD>>& lo) {
  const hn::Rebind<float, DD> df;
  auto e = hn::LoadU(dd, x + i);
  if (y) e = hn::Sub(e, hn::LoadU(dd, y + i));
  hi = hn::DemoteTo(df, e);
  lo = hn::DemoteTo(df, hn::Sub(e, hn::PromoteTo(dd, hi)));
}
template <class DD>
HWY_INLINE void ExpGatesN(DD dd, const double* x, const double* y, int64_t i, float* out) {
  const hn::Rebind<float, DD> df;
  hn::Vec<decltype(df)> hi, lo;
  SplitGates(dd, x, y, i, hi, lo);
  const auto ex = hn::Exp(df, hi);
  hn::StoreU(hn::MulAdd(ex, lo, ex), df, out + i);
}
// ExpGates, and with `neg` also neg[i] = exp(y[i] - x[i]) from the same split negated
// (exp(-hi) * (1 - lo)): f32 rounding is symmetric, so these are the split of y - x exactly.
HWY_INLINE void ExpGates(const double* x, const double* y, int64_t n, float* out,
                         float* neg = nullptr) {
  int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  // Two vectors of doubles make one full vector of floats, so that Exp runs at full width.
  const DF d;
  const hn::Half<DF> dh;
  const hn::Rebind<double, decltype(dh)> dd;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d)), H = L / 2;
  for (; i + L <= n; i += L) {
    hn::Vec<decltype(dh)> hi0, lo0, hi1, lo1;
    SplitGates(dd, x, y, i, hi0, lo0);
    SplitGates(dd, x, y, i + H, hi1, lo1);
    const auto hi = hn::Combine(d, hi1, hi0), lo = hn::Combine(d, lo1, lo0);
    const auto ex = hn::Exp(d, hi);
    hn::StoreU(hn::MulAdd(ex, lo, ex), d, out + i);
    if (neg) {
      const auto en = hn::Exp(d, hn::Neg(hi));
      hn::StoreU(hn::NegMulAdd(en, lo, en), d, neg + i);
    }
  }
#endif
  const hn::CappedTag<double, 1> dd1;
  for (; i < n; ++i) {
    ExpGatesN(dd1, x, y, i, out);
    if (neg) ExpGatesN(dd1, y, x, i, neg);
  }
}

// out[i] = x[i] * e[i]
HWY_INLINE void MulSpan(const float* x, const float* e, int64_t n, float* out) {
  const DF d;
  const D1 d1;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::Mul(hn::LoadU(d, x + i), hn::LoadU(d, e + i)), d, out + i);
  for (; i < n; ++i) hn::StoreU(hn::Mul(hn::LoadU(d1, x + i), hn::LoadU(d1, e + i)), d1, out + i);
}

HWY_INLINE int64_t VecLanes() {
  return static_cast<int64_t>(hn::Lanes(DF()));
}

// y[i] += a * x[i]
HWY_INLINE void Axpy(float a, const float* x, float* y, int64_t n) {
  const DF d;
  const D1 d1;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto va = hn::Set(d, a);
  const auto va1 = hn::Set(d1, a);
  int64_t i = 0;
  for (; i + L <= n; i += L)
    hn::StoreU(hn::MulAdd(va, hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, y + i);
  for (; i < n; ++i)
    hn::StoreU(hn::MulAdd(va1, hn::LoadU(d1, x + i), hn::LoadU(d1, y + i)), d1, y + i);
}

// ---------------------------------------------------------------------------------------------
// MatAcc: out[m, j] (m < M, j < n) = epi(init + sum_{p < P_m} A(m, p) * B[p, j]), the sum in
// increasing p as one fused multiply-add per term, with A(m, p) = a[m * lda_m + p * lda_p] and
// B[p, j] = b[p * ldb + j]. `causal`: row m sums only p <= m (P_m = min(P, tile end); the entries
// of A above the diagonal inside a tile must be zero, and they add exact zeros).
enum class Init { kZero, kOut, kScaledOut };  // acc starts at 0, out, or out * row_scale[m]
enum class Epi { kStore, kSubFrom };          // out = acc, or out = out - acc
struct MatArgs {
  const float* a = nullptr;
  int64_t lda_m = 0, lda_p = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  float* out = nullptr;
  int64_t ldo = 0;
  int64_t M = 0, n = 0, P = 0;
  const float* row_scale = nullptr;
  Init init = Init::kZero;
  Epi epi = Epi::kStore;
  bool causal = false;
};

template <int MR, int NV, class D>
HWY_INLINE void MatTile(D d, const MatArgs& g, int64_t m0, int64_t j0, int64_t P) {
  using V = hn::Vec<D>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  V acc[MR][NV];
  for (int r = 0; r < MR; ++r) {
    float* o = g.out + (m0 + r) * g.ldo + j0;
    for (int v = 0; v < NV; ++v) {
      if (g.init == Init::kZero) {
        acc[r][v] = hn::Zero(d);
      } else if (g.init == Init::kOut) {
        acc[r][v] = hn::LoadU(d, o + v * L);
      } else {
        acc[r][v] = hn::Mul(hn::LoadU(d, o + v * L), hn::Set(d, g.row_scale[m0 + r]));
      }
    }
  }
  for (int64_t p = 0; p < P; ++p) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = hn::LoadU(d, g.b + p * g.ldb + j0 + v * L);
    for (int r = 0; r < MR; ++r) {
      const V av = hn::Set(d, g.a[(m0 + r) * g.lda_m + p * g.lda_p]);
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    float* o = g.out + (m0 + r) * g.ldo + j0;
    for (int v = 0; v < NV; ++v) {
      const V res = g.epi == Epi::kStore ? acc[r][v] : hn::Sub(hn::LoadU(d, o + v * L), acc[r][v]);
      hn::StoreU(res, d, o + v * L);
    }
  }
}

// Columns of MR rows: tiles of NV vectors, then of 2 and 1 vectors, then the ragged end.
template <int MR, int NV>
HWY_INLINE void MatRows(const MatArgs& g, int64_t m0, int64_t P) {
  const DF d;
  const D1 d1;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  for (; j + NV * L <= g.n; j += NV * L) MatTile<MR, NV>(d, g, m0, j, P);
  if constexpr (NV > 2)
    for (; j + 2 * L <= g.n; j += 2 * L) MatTile<MR, 2>(d, g, m0, j, P);
  for (; j + L <= g.n; j += L) MatTile<MR, 1>(d, g, m0, j, P);
  for (; j < g.n; ++j) MatTile<MR, 1>(d1, g, m0, j, P);
}

// Narrow products (n <= 2 vectors: the A / Aqk rows of a sub-block) use taller tiles, so each
// B vector loaded feeds more rows. Tile shapes never change a value, only which registers hold it.
#if HWY_TARGET == HWY_AVX3
constexpr int kNarrowMR = 8, kNarrowNV = 2;  // 16 accumulators
#else
constexpr int kNarrowMR = 8, kNarrowNV = 1;  // 8 accumulators
#endif

void MatAcc(const MatArgs& g) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  auto rows_P = [&g](int64_t m, int64_t rows) { return g.causal ? std::min(g.P, m + rows) : g.P; };
  int64_t m = 0;
  if (g.n <= kNarrowNV * L)
    for (; m + kNarrowMR <= g.M; m += kNarrowMR)
      MatRows<kNarrowMR, kNarrowNV>(g, m, rows_P(m, kNarrowMR));
  for (; m + kMR <= g.M; m += kMR) MatRows<kMR, kNV>(g, m, rows_P(m, kMR));
  for (; m < g.M; ++m) MatRows<1, kNV>(g, m, rows_P(m, 1));
}

// ---------------------------------------------------------------------------------------------
// Recurrent step, one column block [j0, j0 + NV * Lanes(d)) of one head and token.
template <int NV, class D>
HWY_INLINE void RecurrentColumns(D d, const float* qt, const float* kt, const float* vt,
                                 const float* at, float bt, int64_t dk, int64_t dv, int64_t j0,
                                 float* S, float* ot) {
  using V = hn::Vec<D>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  V acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = hn::Zero(d);
  // Pass 1: S^T k of the decayed state (increasing i).
  for (int64_t i = 0; i < dk; ++i) {
    const float* Si = S + i * dv + j0;
    const V a = hn::Set(d, at[i]), k = hn::Set(d, kt[i]);
    for (int v = 0; v < NV; ++v)
      acc[v] = hn::MulAdd(k, hn::Mul(a, hn::LoadU(d, Si + v * L)), acc[v]);
  }
  // delta = (v - S^T k) * beta
  V delta[NV];
  const V b = hn::Set(d, bt);
  for (int v = 0; v < NV; ++v) {
    delta[v] = hn::Mul(hn::Sub(hn::LoadU(d, vt + j0 + v * L), acc[v]), b);
    acc[v] = hn::Zero(d);
  }
  // Pass 2: S_i = a_i S_i + k_i delta (written back); o = S^T q over the updated rows.
  for (int64_t i = 0; i < dk; ++i) {
    float* Si = S + i * dv + j0;
    const V a = hn::Set(d, at[i]), k = hn::Set(d, kt[i]), q = hn::Set(d, qt[i]);
    for (int v = 0; v < NV; ++v) {
      const V s = hn::MulAdd(k, delta[v], hn::Mul(a, hn::LoadU(d, Si + v * L)));
      hn::StoreU(s, d, Si + v * L);
      acc[v] = hn::MulAdd(q, s, acc[v]);
    }
  }
  for (int v = 0; v < NV; ++v) hn::StoreU(acc[v], d, ot + j0 + v * L);
}

// One head, T tokens; at [dk] receives exp(g_t) of the current token (caller's stack buffer).
void KdaRecurrentHead(const float* q, const float* k, const float* v, const float* g,
                      const float* beta, int64_t T, int64_t H, int64_t h, int64_t dk, int64_t dv,
                      float* S, float* o, float* at) {
  const DF d;
  const D1 d1;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t t = 0; t < T; ++t) {
    const float* qt = q + (t * H + h) * dk;
    const float* kt = k + (t * H + h) * dk;
    const float* vt = v + (t * H + h) * dv;
    const float bt = beta[t * H + h];
    float* ot = o + (t * H + h) * dv;
    ExpDiff(g + (t * H + h) * dk, nullptr, dk, at);
    int64_t j = 0;
    for (; j + kRecNV * L <= dv; j += kRecNV * L)
      RecurrentColumns<kRecNV>(d, qt, kt, vt, at, bt, dk, dv, j, S, ot);
    for (; j + L <= dv; j += L) RecurrentColumns<1>(d, qt, kt, vt, at, bt, dk, dv, j, S, ot);
    for (; j < dv; ++j) RecurrentColumns<1>(d1, qt, kt, vt, at, bt, dk, dv, j, S, ot);
  }
}

// ---------------------------------------------------------------------------------------------
// Chunked prefill for one head: kda_chunked_ref()'s algorithm (see kda.cpp for the derivation)
// on the same per-head scratch layout, which kda_chunk_scratch_floats() sizes.
// Sub-blocks as in the twin (kda.h); exp(+-kKdaMaxFactorLog) is inside Highway Exp's range.

void KdaChunkedHead(const float* q, const float* k, const float* v, const float* g,
                    const float* beta, int64_t T, int64_t H, int64_t h, int64_t dk, int64_t dv,
                    int64_t C, float* S, float* o, float* scratch) {
  const int64_t NB = kda_sub_blocks(C);
  double* gc = reinterpret_cast<double*>(scratch);  // [C, dk] cumulative log decay (2 floats each)
  float* A = scratch + 2 * C * dk;      // [C, C] A, then T = (I + A) diag(beta), then Aqk
  float* w = A + C * C;                 // [C, dk] w, then the decayed keys of the state update
  float* u = w + C * dk;                // [C, dv] u, then v_new
  float* eg = u + C * dv;               // [C, dk] exp(gc) rows (for kg and qg)
  float* tmp = eg + C * dk;             // [dk] exp row / state decay
  float* tmp2 = tmp + dk;               // [dk] exp row
  float* kd = tmp2 + dk;                // [C, dk] k_c exp(gc_c - gc_s(c)), then kg, then q exp(gc)
  float* qd = kd + C * dk;              // [C, dk] q_c exp(gc_c - gc_s(c))
  float* kuT = qd + C * dk;             // [NB, dk, C] k_i[d] exp(gc_s_b[d] - gc_i[d])
  float* factored = kuT + NB * C * dk;  // [NB] 1 = factored form usable
  auto row = [H, h](int64_t t, int64_t width) { return (t * H + h) * width; };
  const int64_t ldv = H * dv;  // token stride of v and o
  for (int64_t t0 = 0; t0 < T; t0 += C) {
    const int64_t L = std::min(C, T - t0);
    kda_cumulative_gates(g, t0, L, H, h, dk, gc);  // the twin's values
    for (int64_t b = 0; b * kKdaSubBlock < L; ++b) {
      const int64_t s0 = b * kKdaSubBlock, s1 = std::min(L, s0 + kKdaSubBlock);
      factored[b] = kda_sub_block_factored(gc, s0, s1, dk) ? 1.0f : 0.0f;
      if (factored[b] == 0.0f) continue;
      // Inside the sub-block the row factor exp(gc_c - gc_s) is the inverse of the column
      // factor exp(gc_s - gc_c): one split, both exponentials.
      float* kub = kuT + b * dk * C;  // [dk, C]
      for (int64_t i = 0; i < s1; ++i) {
        const bool inside = i >= s0;
        ExpGates(gc + s0 * dk, gc + i * dk, dk, tmp, inside ? tmp2 : nullptr);
        const float* ki = k + row(t0 + i, dk);
        for (int64_t d = 0; d < dk; ++d) kub[d * C + i] = ki[d] * tmp[d];
        if (inside) {
          MulSpan(ki, tmp2, dk, kd + i * dk);
          MulSpan(q + row(t0 + i, dk), tmp2, dk, qd + i * dk);
        }
      }
    }
    // Rows [s0, s1) of out (row stride C) = x_c . diag(exp(gc_c - gc_i)) k_i for i < s1 (the
    // caller keeps what it needs); x = k for A, q for Aqk; xd = the sub-block-decayed rows.
    auto decayed_dots = [&](const float* x, const float* xd, float* out) {
      for (int64_t b = 0; b * kKdaSubBlock < L; ++b) {
        const int64_t s0 = b * kKdaSubBlock, s1 = std::min(L, s0 + kKdaSubBlock);
        if (factored[b] != 0.0f) {
          MatArgs m;
          m.a = xd + s0 * dk;
          m.lda_m = dk;
          m.lda_p = 1;
          m.b = kuT + b * dk * C;
          m.ldb = C;
          m.out = out + s0 * C;
          m.ldo = C;
          m.M = s1 - s0;
          m.n = s1;
          m.P = dk;
          MatAcc(m);
          continue;
        }
        // Exact pairwise exponentials (only without a gate lower bound), as in the twin.
        for (int64_t c = s0; c < s1; ++c) {
          const float* xc = x + row(t0 + c, dk);
          for (int64_t i = 0; i <= c; ++i) {
            const float* ki = k + row(t0 + i, dk);
            float acc = 0.0f;
            for (int64_t d = 0; d < dk; ++d)
              acc += xc[d] * std::exp(static_cast<float>(gc[c * dk + d] - gc[i * dk + d])) * ki[d];
            out[c * C + i] = acc;
          }
        }
      }
    };
    // A[c][i] (i < c) = -beta_c k_c . diag(exp(gc_c - gc_i)) k_i; zero from the diagonal on.
    decayed_dots(k, kd, A);
    for (int64_t c = 0; c < L; ++c) {
      const float bc = beta[(t0 + c) * H + h];
      float* Ac = A + c * C;
      for (int64_t i = 0; i < c; ++i) Ac[i] = -Ac[i] * bc;
      for (int64_t i = c; i < L; ++i) Ac[i] = 0.0f;
    }
    // Forward substitution, rows become those of (I - A_strict)^-1 - I: row c += A[c][m] row m
    // for m increasing, so entry i gets its terms m = i + 1 .. c - 1 in the twin's order (A[c][m]
    // is still the original value when used: only later m touch entries left of m).
    // The axpy may run on to a whole number of vectors while that stays inside the chunk's L
    // columns: row m is zero from its diagonal on, so the extra entries of row c get exact zeros.
    const int64_t lanes = VecLanes();
    for (int64_t c = 2; c < L; ++c)
      for (int64_t m = 1; m < c; ++m) {
        const int64_t padded = (m + lanes - 1) / lanes * lanes;
        Axpy(A[c * C + m], A + m * C, A + c * C, padded <= L ? padded : m);
      }
    // T = (A + I) diag(beta) in place (upper triangle stays zero).
    for (int64_t c = 0; c < L; ++c) {
      float* Ac = A + c * C;
      Ac[c] = 1.0f;
      for (int64_t i = 0; i <= c; ++i) Ac[i] *= beta[(t0 + i) * H + h];
    }
    // kg = exp(gc) * k (into kd); w = T kg; u = T v.
    float* kg = kd;
    for (int64_t i = 0; i < L; ++i) {
      ExpGates(gc + i * dk, nullptr, dk, eg + i * dk);
      MulSpan(k + row(t0 + i, dk), eg + i * dk, dk, kg + i * dk);
    }
    MatArgs mw;
    mw.a = A;
    mw.lda_m = C;
    mw.lda_p = 1;
    mw.b = kg;
    mw.ldb = dk;
    mw.out = w;
    mw.ldo = dk;
    mw.M = L;
    mw.n = dk;
    mw.P = L;
    mw.causal = true;
    MatAcc(mw);
    MatArgs mu = mw;
    mu.b = v + row(t0, dv);
    mu.ldb = ldv;
    mu.out = u;
    mu.ldo = dv;
    mu.n = dv;
    MatAcc(mu);
    // v_new = u - w S (into u).
    MatArgs mv;
    mv.a = w;
    mv.lda_m = dk;
    mv.lda_p = 1;
    mv.b = S;
    mv.ldb = dv;
    mv.out = u;
    mv.ldo = dv;
    mv.M = L;
    mv.n = dv;
    mv.P = dk;
    mv.epi = Epi::kSubFrom;
    MatAcc(mv);
    // Aqk (into A, zero above the diagonal); qg = q exp(gc) (into kd).
    decayed_dots(q, qd, A);
    for (int64_t c = 0; c < L; ++c)
      for (int64_t i = c + 1; i < L; ++i) A[c * C + i] = 0.0f;
    float* qg = kd;
    for (int64_t c = 0; c < L; ++c) MulSpan(q + row(t0 + c, dk), eg + c * dk, dk, qg + c * dk);
    // o = qg S + Aqk v_new
    MatArgs mo;
    mo.a = qg;
    mo.lda_m = dk;
    mo.lda_p = 1;
    mo.b = S;
    mo.ldb = dv;
    mo.out = o + row(t0, dv);
    mo.ldo = ldv;
    mo.M = L;
    mo.n = dv;
    mo.P = dk;
    MatAcc(mo);
    MatArgs mo2 = mo;
    mo2.a = A;
    mo2.lda_m = C;
    mo2.b = u;
    mo2.P = L;
    mo2.init = Init::kOut;
    mo2.causal = true;
    MatAcc(mo2);
    // S = diag(exp(gc_last)) S + sum_c (exp(gc_last - gc_c) k_c) v_new_c^T, decayed keys in w.
    const double* gl = gc + (L - 1) * dk;
    float* kdec = w;  // [C, dk]
    for (int64_t c = 0; c < L; ++c) {
      ExpGates(gl, gc + c * dk, dk, tmp);
      MulSpan(k + row(t0 + c, dk), tmp, dk, kdec + c * dk);
    }
    ExpGates(gl, nullptr, dk, tmp);
    MatArgs ms;
    ms.a = kdec;
    ms.lda_m = 1;
    ms.lda_p = dk;
    ms.b = u;
    ms.ldb = dv;
    ms.out = S;
    ms.ldo = dv;
    ms.M = dk;
    ms.n = dv;
    ms.P = L;
    ms.row_scale = tmp;
    ms.init = Init::kScaledOut;
    MatAcc(ms);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(KdaRecurrentHead);
HWY_EXPORT(KdaChunkedHead);

void kda_recurrent(const float* q, const float* k, const float* v, const float* g,
                   const float* beta, int64_t T, int64_t H, int64_t dk, int64_t dv, float* state,
                   float* o) {
  constexpr int64_t kMaxDk = 1024;  // exp(g_t) row on the stack; larger dk is not a KDA shape
  if (dk > kMaxDk) {
    kda_recurrent_ref(q, k, v, g, beta, T, H, dk, dv, state, o);
    return;
  }
  const auto head = HWY_DYNAMIC_DISPATCH(KdaRecurrentHead);
  parallel_ranges(H, T * H * dk * dv > kParallelMinWork, [&](int64_t h_begin, int64_t h_end) {
    for (int64_t h = h_begin; h < h_end; ++h) {
      float at[kMaxDk];
      head(q, k, v, g, beta, T, H, h, dk, dv, state + h * dk * dv, o, at);
    }
  });
}

void kda_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                 int64_t T, int64_t H, int64_t dk, int64_t dv, int64_t chunk, float* state,
                 float* o, float* scratch) {
  const int64_t per_head = kda_chunk_scratch_floats(1, chunk, dk, dv);
  // The per-head layout of KdaChunkedHead (the twin's, minus its accumulator row) must fit.
  const int64_t nb = kda_sub_blocks(chunk);
  assert(per_head >= chunk * (6 * dk + chunk + dv) + 2 * dk + nb * (chunk * dk + 1));
  assert(per_head % 2 == 0);  // every head's double gc stays 8-byte aligned
  (void)nb;
  const auto head = HWY_DYNAMIC_DISPATCH(KdaChunkedHead);
  parallel_ranges(H, T * H * dk * dv > kParallelMinWork, [&](int64_t h0, int64_t h1) {
    for (int64_t h = h0; h < h1; ++h)
      head(q, k, v, g, beta, T, H, h, dk, dv, chunk, state + h * dk * dv, o,
           scratch + h * per_head);
  });
}

}  // namespace attnres
#endif  // HWY_ONCE
