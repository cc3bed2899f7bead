// MLA attention (mla.h) with Highway runtime dispatch: one copy per compiled target (AVX3 =
// AVX-512, AVX2, SSE4, SSSE3, SCALAR), chosen once per process; no -march flags. Same functions
// as the scalar twins mla_attend_expanded_ref() and mla_attend_absorbed_ref() (mla.cpp) up to
// f32 rounding; tests/unit/kernels/test_kda_mla.cpp bounds the difference on every target.
//
// Numerics (fixed per-element order, depending only on the sizes and the target):
//  - Expanded: a score is sum_d q_d k_d over the nope then the rope dimensions in increasing d,
//    one fused multiply-add per term in the token's own lane (query tokens lie along the vector
//    lanes, see ExpandedLanes), times the scale. Absorbed decode keeps matmul_batch for the
//    scores (the order documented in matmul_hwy.cpp).
//  - Softmax: the max, then exp(s - max) with Highway's Exp (<= 1 ulp), summed (absorbed: lane
//    accumulators + SumOfLanes + the ragged end in order; expanded: per token lane in increasing
//    j), then multiplied by 1 / sum.
//  - Weighted sums over context rows (o = sum_j p_j v_j, o_lat = sum_j p_j c_kv_j) are lane-wise
//    along the contiguous dimension: each output column accumulates its terms in increasing row
//    index with one fused multiply-add each, whether it sits in a full vector or the ragged end
//    (1-lane vectors of the same target), whatever the register tile it falls in.
//  - Absorbed decode's q_lat = W_UK[h]^T q_nope and o = W_UV[h] o_lat are projection jobs over
//    the per-head weights of MlaAbsorbedWeights (the lane kernels' order, matmul_lanes.h, for
//    BF16 weights): an output's bits depend only on its row and K, not on how many query rows
//    share the job.
//  - Work is split over (head, query block) or (column block) items; each output element is
//    computed by one thread, so results do not depend on the thread count.
//
// Memory: absorbed decode reads the latent cache c_kv [N, r] once per token for the scores
// (matmul_batch, all heads against each row) and once for o_lat: the o_lat products are split
// over column blocks of c_kv (one per thread's share) and walked in blocks of context rows that
// stay in L1 while every head's accumulators pass over them, instead of once per head.
// Expanded prefill walks one head at a time (its keys and values, [n_ctx, nope + v], stay in
// L2) over blocks of 2 vectors of query tokens; each key element loaded feeds 2 vector FMAs.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/mla_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "kernels/matmul.h"
#include "kernels/mla.h"
#include "kernels/parallel.h"
#include "util/numeric.h"
#include "util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
using D1 = hn::CappedTag<float, 1>;

#if HWY_TARGET == HWY_AVX3
constexpr int kMR = 4, kNV = 4;  // heads / tokens x vectors of accumulators (16 of 32 regs)
#else
constexpr int kMR = 4, kNV = 2;  // 8 of 16 registers
#endif
constexpr int64_t kCtxBlock = 64;  // context rows per block of the o_lat products

// Weight rows widened exactly (bf16 is the high half of an f32).
template <class D>
HWY_INLINE hn::Vec<D> LoadW(D d, const float* p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadW(D d, const bf16* p) {
  const hn::RebindToUnsigned<D> du;
  const hn::Rebind<uint16_t, D> du16;
  const auto h = hn::LoadU(du16, reinterpret_cast<const uint16_t*>(p));
  return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, h)));
}

// p[0..n) = softmax(s[0..n)) in place.
void SoftmaxInplace(float* s, int64_t n) {
  const DF d;
  const D1 d1;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  VF vmax = hn::Set(d, -std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + L <= n; j += L) vmax = hn::Max(vmax, hn::LoadU(d, s + j));
  float mx = hn::GetLane(hn::MaxOfLanes(d, vmax));
  for (; j < n; ++j) mx = std::max(mx, s[j]);
  const VF vm = hn::Set(d, mx);
  const auto vm1 = hn::Set(d1, mx);
  VF acc = hn::Zero(d);
  for (j = 0; j + L <= n; j += L) {
    const VF e = hn::Exp(d, hn::Sub(hn::LoadU(d, s + j), vm));
    hn::StoreU(e, d, s + j);
    acc = hn::Add(acc, e);
  }
  float sum = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; j < n; ++j) {
    const auto e = hn::Exp(d1, hn::Sub(hn::LoadU(d1, s + j), vm1));
    hn::StoreU(e, d1, s + j);
    sum += hn::GetLane(e);
  }
  const VF inv = hn::Set(d, 1.0f / sum);
  for (j = 0; j + L <= n; j += L) hn::StoreU(hn::Mul(hn::LoadU(d, s + j), inv), d, s + j);
  for (; j < n; ++j) s[j] *= 1.0f / sum;
}

// ---------------------------------------------------------------------------------------------
// Weighted row sums: out[m][c] (m < M, c in [c0, c0 + width)) = init + sum_{p in [p0, p1)}
// coef[m * ldc + p] * X[p * ldx + c], increasing p, init = 0 (p0 == 0 and !accumulate) or out.
template <int MR, int NV, class D, typename X>
HWY_INLINE void RowSumTile(D d, const float* coef, int64_t ldm, int64_t ldc, const X* x,
                           int64_t ldx, int64_t p0, int64_t p1, bool accumulate, float* out,
                           int64_t ldo, int64_t c0) {
  using V = hn::Vec<D>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  V acc[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v)
      acc[m][v] = accumulate ? hn::LoadU(d, out + m * ldo + c0 + v * L) : hn::Zero(d);
  for (int64_t p = p0; p < p1; ++p) {
    V xv[NV];
    for (int v = 0; v < NV; ++v) xv[v] = LoadW(d, x + p * ldx + c0 + v * L);
    for (int m = 0; m < MR; ++m) {
      const V a = hn::Set(d, coef[m * ldm + p * ldc]);
      for (int v = 0; v < NV; ++v) acc[m][v] = hn::MulAdd(a, xv[v], acc[m][v]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) hn::StoreU(acc[m][v], d, out + m * ldo + c0 + v * L);
}

// Columns [c0, c1) of MR rows: full tiles, single vectors, then the ragged end.
template <int MR, typename X>
HWY_INLINE void RowSumColumns(const float* coef, int64_t ldm, int64_t ldc, const X* x, int64_t ldx,
                              int64_t p0, int64_t p1, bool accumulate, float* out, int64_t ldo,
                              int64_t c0, int64_t c1) {
  const DF d;
  const D1 d1;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t c = c0;
  for (; c + kNV * L <= c1; c += kNV * L)
    RowSumTile<MR, kNV>(d, coef, ldm, ldc, x, ldx, p0, p1, accumulate, out, ldo, c);
  for (; c + L <= c1; c += L)
    RowSumTile<MR, 1>(d, coef, ldm, ldc, x, ldx, p0, p1, accumulate, out, ldo, c);
  for (; c < c1; ++c)
    RowSumTile<MR, 1>(d1, coef, ldm, ldc, x, ldx, p0, p1, accumulate, out, ldo, c);
}

// All M rows (tiles of kMR, then single rows).
template <typename X>
HWY_INLINE void RowSums(int64_t M, const float* coef, int64_t ldm, int64_t ldc, const X* x,
                        int64_t ldx, int64_t p0, int64_t p1, bool accumulate, float* out,
                        int64_t ldo, int64_t c0, int64_t c1) {
  int64_t m = 0;
  for (; m + kMR <= M; m += kMR)
    RowSumColumns<kMR>(coef + m * ldm, ldm, ldc, x, ldx, p0, p1, accumulate, out + m * ldo, ldo, c0,
                       c1);
  for (; m < M; ++m)
    RowSumColumns<1>(coef + m * ldm, ldm, ldc, x, ldx, p0, p1, accumulate, out + m * ldo, ldo, c0,
                     c1);
}

// Not inlined into callers with constant sizes (GCC 12 then reports a bogus overflow in the
// row-remainder loop under -Waggressive-loop-optimizations).
HWY_NOINLINE void RowSumsF32(int64_t M, const float* coef, int64_t ldm, int64_t ldc, const float* x,
                             int64_t ldx, int64_t p0, int64_t p1, bool accumulate, float* out,
                             int64_t ldo, int64_t c0, int64_t c1) {
  RowSums(M, coef, ldm, ldc, x, ldx, p0, p1, accumulate, out, ldo, c0, c1);
}

// ---------------------------------------------------------------------------------------------
// Expanded attention, query tokens along the vector lanes. A block of NQ vectors of query tokens
// (one token per lane) of head h: its queries are transposed onto the stack (QT [qw, W]), so a
// score tile is NK keys x W tokens of accumulators fed by one query-vector load per dimension and
// one broadcast key element per key (no cross-lane sums); scores, softmax and the causal mask
// are then lane-wise over the block's transposed score rows ST [n_last, W], which live in the
// scratch rows of the block's own tokens (W x N floats). A token's value follows the same
// sequence whatever block it is in: s = (sum_d q_d k_d in increasing d) * scale; the softmax
// max and sum run over j in increasing order; o sums p_j v_j in increasing j, where the masked
// entries (j past the token's context, inside a block whose last token sees further) add exact
// zeros.
#if HWY_TARGET == HWY_AVX3
constexpr int kNK = 8;  // keys per score tile: kNK x 2 query vectors = 16 accumulators
#else
constexpr int kNK = 4;           // 8 accumulators
#endif
constexpr int kExpandedNQ = 2;      // query vectors per full block
constexpr int64_t kMaxQkDim = 576;  // nope + rope the stack transpose holds

template <int NK, int NQ, class D>
HWY_INLINE void ScoreTile(D d, const float* qt, int64_t W, const float* kh, int64_t ldk,
                          const float* k_rot, int64_t nope, int64_t rope, float scale, int64_t j0,
                          float* st) {
  using V = hn::Vec<D>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  V acc[NK][NQ];
  for (int k = 0; k < NK; ++k)
    for (int v = 0; v < NQ; ++v) acc[k][v] = hn::Zero(d);
  for (int64_t i = 0; i < nope; ++i) {
    V qv[NQ];
    for (int v = 0; v < NQ; ++v) qv[v] = hn::LoadU(d, qt + i * W + v * L);
    for (int k = 0; k < NK; ++k) {
      const V kb = hn::Set(d, kh[(j0 + k) * ldk + i]);
      for (int v = 0; v < NQ; ++v) acc[k][v] = hn::MulAdd(qv[v], kb, acc[k][v]);
    }
  }
  for (int64_t i = 0; i < rope; ++i) {
    V qv[NQ];
    for (int v = 0; v < NQ; ++v) qv[v] = hn::LoadU(d, qt + (nope + i) * W + v * L);
    for (int k = 0; k < NK; ++k) {
      const V kb = hn::Set(d, k_rot[(j0 + k) * rope + i]);
      for (int v = 0; v < NQ; ++v) acc[k][v] = hn::MulAdd(qv[v], kb, acc[k][v]);
    }
  }
  const V vs = hn::Set(d, scale);
  for (int k = 0; k < NK; ++k)
    for (int v = 0; v < NQ; ++v) hn::StoreU(hn::Mul(acc[k][v], vs), d, st + (j0 + k) * W + v * L);
}

// Tokens [t0, t0 + NQ * Lanes(d)) of head h.
template <int NQ, class D>
HWY_INLINE void ExpandedLanes(D d, const MlaDims& dm, const float* q, int64_t T, const float* kv,
                              const float* k_rot, int64_t N, int64_t h, int64_t t0, float* o,
                              float* scratch) {
  using V = hn::Vec<D>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d)), W = NQ * L;
  const int64_t P = N - T, qw = dm.nope + dm.rope, kvw = dm.nope + dm.v, H = dm.H;
  const int64_t n_first = P + t0 + 1, n_last = P + t0 + W;  // contexts of the first/last token
  HWY_ALIGN float qt[kMaxQkDim * kExpandedNQ * hn::MaxLanes(DF())];  // QT [qw, W]
  for (int64_t t = 0; t < W; ++t)
    for (int64_t i = 0; i < qw; ++i) qt[i * W + t] = q[((t0 + t) * H + h) * qw + i];
  float* st = scratch + t0 * N;  // ST [n_last, W]: the block's W score rows, transposed
  const float* kh = kv + h * kvw;
  int64_t j = 0;
  for (; j + kNK <= n_last; j += kNK)
    ScoreTile<kNK, NQ>(d, qt, W, kh, H * kvw, k_rot, dm.nope, dm.rope, dm.scale, j, st);
  for (; j < n_last; ++j)
    ScoreTile<1, NQ>(d, qt, W, kh, H * kvw, k_rot, dm.nope, dm.rope, dm.scale, j, st);
  // Softmax per lane over j < n_t = n_first + lane (rows j >= n_first are partly masked).
  const hn::RebindToSigned<D> di;
  const auto lane = hn::Iota(di, 0);
  auto valid = [&](int64_t jj, int v) {  // lane t = v * L + lane valid iff j < n_first + t
    return hn::RebindMask(d, hn::Gt(hn::Add(lane, hn::Set(di, static_cast<int32_t>(v * L))),
                                    hn::Set(di, static_cast<int32_t>(jj - n_first))));
  };
  V mx[NQ], sum[NQ];
  for (int v = 0; v < NQ; ++v) {
    mx[v] = hn::Set(d, -std::numeric_limits<float>::infinity());
    sum[v] = hn::Zero(d);
  }
  for (j = 0; j < n_last; ++j)
    for (int v = 0; v < NQ; ++v) {
      const V sv = hn::LoadU(d, st + j * W + v * L);
      mx[v] =
          j < n_first ? hn::Max(mx[v], sv) : hn::IfThenElse(valid(j, v), hn::Max(mx[v], sv), mx[v]);
    }
  for (j = 0; j < n_last; ++j)
    for (int v = 0; v < NQ; ++v) {
      float* sp = st + j * W + v * L;
      V e = hn::Exp(d, hn::Sub(hn::LoadU(d, sp), mx[v]));
      if (j >= n_first) e = hn::IfThenElseZero(valid(j, v), e);
      hn::StoreU(e, d, sp);
      sum[v] = hn::Add(sum[v], e);
    }
  for (int v = 0; v < NQ; ++v) sum[v] = hn::Div(hn::Set(d, 1.0f), sum[v]);
  for (j = 0; j < n_last; ++j)
    for (int v = 0; v < NQ; ++v) {
      float* sp = st + j * W + v * L;
      hn::StoreU(hn::Mul(hn::LoadU(d, sp), sum[v]), d, sp);
    }
  // o_t = sum_j p_jt v_j: token rows t (coefficients st[j * W + t]) x v columns.
  float* ob = o + (t0 * H + h) * dm.v;  // token t at ob + t * H * v
  RowSumsF32(W, st, 1, W, kh + dm.nope, H * kvw, 0, n_last, false, ob, H * dm.v, 0, dm.v);
}

// Work item b of head h: full blocks of kExpandedNQ vectors, then single vectors, then single
// tokens (1-lane vectors: the same per-lane sequence).
void ExpandedItem(const MlaDims& dm, const float* q, int64_t T, const float* kv, const float* k_rot,
                  int64_t N, int64_t h, int64_t b, float* o, float* scratch) {
  const DF d;
  const D1 d1;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d)), W = kExpandedNQ * L;
  const int64_t full = T / W, singles = (T - full * W) / L;
  if (b < full) {
    ExpandedLanes<kExpandedNQ>(d, dm, q, T, kv, k_rot, N, h, b * W, o, scratch);
  } else if (b < full + singles) {
    ExpandedLanes<1>(d, dm, q, T, kv, k_rot, N, h, full * W + (b - full) * L, o, scratch);
  } else {
    ExpandedLanes<1>(d1, dm, q, T, kv, k_rot, N, h, full * W + singles * L + (b - full - singles),
                     o, scratch);
  }
}

int64_t ExpandedItems(int64_t T) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF())), W = kExpandedNQ * L;
  const int64_t full = T / W, singles = (T - full * W) / L;
  return full + singles + (T - full * W - singles * L);
}

// Scores of head h: s = (s_lat + s_rot) * scale, then softmax over n.
void HeadSoftmax(float* s, const float* sr, int64_t n, float scale) {
  const DF d;
  const D1 d1;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF vs = hn::Set(d, scale);
  const auto vs1 = hn::Set(d1, scale);
  int64_t j = 0;
  if (sr) {
    for (; j + L <= n; j += L)
      hn::StoreU(hn::Mul(hn::Add(hn::LoadU(d, s + j), hn::LoadU(d, sr + j)), vs), d, s + j);
    for (; j < n; ++j)
      hn::StoreU(hn::Mul(hn::Add(hn::LoadU(d1, s + j), hn::LoadU(d1, sr + j)), vs1), d1, s + j);
  } else {
    for (; j + L <= n; j += L) hn::StoreU(hn::Mul(hn::LoadU(d, s + j), vs), d, s + j);
    for (; j < n; ++j) hn::StoreU(hn::Mul(hn::LoadU(d1, s + j), vs1), d1, s + j);
  }
  SoftmaxInplace(s, n);
}

// o_lat[:, c0..c1) = p [H, n] c_kv[n, r][:, c0..c1) over a context in pages of page_rows rows,
// rows in blocks of kCtxBlock inside each page (the block's columns stay in L1 while all heads
// pass over them). Every column accumulates its rows in increasing index (through memory
// between blocks, which is exact), so the paging never changes a value.
template <typename X>
void OLatColumns(const float* p, int64_t H, int64_t n, const X* const* pages, int64_t page_rows,
                 int64_t r, int64_t c0, int64_t c1, float* o_lat) {
  for (int64_t base = 0, k = 0; base < n; base += page_rows, ++k) {
    const int64_t rows = std::min(page_rows, n - base);
    for (int64_t j0 = 0; j0 < rows; j0 += kCtxBlock) {
      const int64_t j1 = std::min(rows, j0 + kCtxBlock);
      RowSums(H, p + base, n, 1, pages[k], r, j0, j1, base + j0 > 0, o_lat, r, c0, c1);
    }
  }
}
void OLatColumnsF32(const float* p, int64_t H, int64_t n, const float* const* pages,
                    int64_t page_rows, int64_t r, int64_t c0, int64_t c1, float* o_lat) {
  OLatColumns(p, H, n, pages, page_rows, r, c0, c1, o_lat);
}
void OLatColumnsBf16(const float* p, int64_t H, int64_t n, const bf16* const* pages,
                     int64_t page_rows, int64_t r, int64_t c0, int64_t c1, float* o_lat) {
  OLatColumns(p, H, n, pages, page_rows, r, c0, c1, o_lat);
}

int64_t ColumnBlockWidth() {
  return kNV * static_cast<int64_t>(hn::Lanes(DF()));
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(ExpandedItem);
HWY_EXPORT(ExpandedItems);
HWY_EXPORT(HeadSoftmax);
HWY_EXPORT(OLatColumnsF32);
HWY_EXPORT(OLatColumnsBf16);
HWY_EXPORT(ColumnBlockWidth);

void mla_attend_expanded(const MlaDims& d, const float* q, int64_t T, const float* kv,
                         const float* k_rot, int64_t N, float* o, float* scratch) {
  if (d.nope + d.rope > HWY_NAMESPACE::kMaxQkDim) {  // beyond the stack transpose
    mla_attend_expanded_ref(d, q, T, kv, k_rot, N, o, scratch);
    return;
  }
  const auto item = HWY_DYNAMIC_DISPATCH(ExpandedItem);
  const int64_t items = HWY_DYNAMIC_DISPATCH(ExpandedItems)(T);
  // Heads in turn, the query blocks of a head split over the threads (each block's score rows
  // are its own tokens' scratch rows, so heads must not overlap: one region per head).
  const bool parallel = T * N * d.H * (d.nope + d.v) > kParallelMinWork;
  for (int64_t h = 0; h < d.H; ++h) {
    if (parallel && items > 1) {
      parallel_tasks(items, [&](int64_t b) { item(d, q, T, kv, k_rot, N, h, b, o, scratch); });
    } else {
      for (int64_t b = 0; b < items; ++b) item(d, q, T, kv, k_rot, N, h, b, o, scratch);
    }
  }
}

namespace {

// Context rows as weight rows of a batch job, and the o_lat kernel, per context type.
MatmulJob context_job(const float* x, int64_t T, const float* w, int64_t N, int64_t K, float* y) {
  return f32_job(x, T, w, N, K, y);
}
MatmulJob context_job(const float* x, int64_t T, const bf16* w, int64_t N, int64_t K, float* y) {
  return bf16_job(x, T, w, N, K, y);
}
auto olat_kernel(const float* const*) {
  return HWY_DYNAMIC_DISPATCH(OLatColumnsF32);
}
auto olat_kernel(const bf16* const*) {
  return HWY_DYNAMIC_DISPATCH(OLatColumnsBf16);
}

// y(h) [n, rows of W[h]] = x(h) [n, K] W[h]^T for each head h < H: one projection job per
// head, all heads in one batch (W_UK^T for q_lat, W_UV for o).
template <typename X, typename Y>
void head_projections(int64_t H, const TensorView* W, int64_t n, const X& x, const Y& y,
                      MatmulJob* jobs) {
  for (int64_t h = 0; h < H; ++h) jobs[h] = dense_job(x(h), n, W[h], y(h));
  matmul_batch(jobs, H);
}

template <typename C>
void attend_absorbed(const MlaDims& d, const float* q, int64_t T, const PagedRows<C>& c_kv,
                     const PagedRows<C>& k_rot, const MlaAbsorbedWeights& w, float* o,
                     float* scratch) {
  const int64_t N = c_kv.rows, P = N - T, qw = d.nope + d.rope, H = d.H;
  const int64_t r = d.r, pr = c_kv.page_rows;
  // The twin's scratch layout (s_lat / s_rot rows are n_ctx long within their [H, N] space).
  const MlaAbsorbedScratch sc = mla_absorbed_scratch(d, N, scratch, pr);
  MatmulJob* jobs = sc.jobs;
  float *q_lat = sc.q_lat, *q_rot = sc.q_rot, *s_lat = sc.s_lat, *s_rot = sc.s_rot;
  float* o_lat = sc.o_lat;
  const auto head_softmax = HWY_DYNAMIC_DISPATCH(HeadSoftmax);
  const auto olat_cols = olat_kernel(c_kv.pages);
  const int64_t cbw = HWY_DYNAMIC_DISPATCH(ColumnBlockWidth)();
  const int64_t ncb = (r + cbw - 1) / cbw;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n_ctx = P + t + 1;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < d.rope; ++i) q_rot[h * d.rope + i] = q[(t * H + h) * qw + d.nope + i];
    // q_lat[h] = W_UK[h]^T q_nope[h], all heads in one batch.
    head_projections(
        H, w.uk_t, 1, [&](int64_t h) { return q + (t * H + h) * qw; },
        [&](int64_t h) { return q_lat + h * r; }, jobs);
    // Scores of every head against the context in one batch, one job per context page (c_kv /
    // k_rot rows act as weight rows): [H, r] x c_kv[n_ctx, r]^T and [H, rope] x
    // k_rot[n_ctx, rope]^T into the [H, n_ctx] score rows.
    int64_t nj = 0;
    for (int64_t base = 0, k = 0; base < n_ctx; base += pr, ++k) {
      const int64_t rows = std::min(pr, n_ctx - base);
      jobs[nj] = context_job(q_lat, H, c_kv.pages[k], rows, r, s_lat + base);
      jobs[nj++].ldy = n_ctx;
      if (d.rope > 0) {
        jobs[nj] = context_job(q_rot, H, k_rot.pages[k], rows, d.rope, s_rot + base);
        jobs[nj++].ldy = n_ctx;
      }
    }
    matmul_batch(jobs, nj);
    // Softmax per head, then o_lat = p c_kv split over column blocks of c_kv.
    const bool parallel = H * n_ctx * r > kParallelMinWork;
    parallel_ranges(H, parallel, [&](int64_t h0, int64_t h1) {
      for (int64_t h = h0; h < h1; ++h)
        head_softmax(s_lat + h * n_ctx, d.rope > 0 ? s_rot + h * n_ctx : nullptr, n_ctx, d.scale);
    });
    parallel_ranges(ncb, parallel, [&](int64_t c0, int64_t c1) {
      for (int64_t cb = c0; cb < c1; ++cb)
        olat_cols(s_lat, H, n_ctx, c_kv.pages, pr, r, cb * cbw, std::min(r, (cb + 1) * cbw), o_lat);
    });
    // o[t, h] = W_UV[h] o_lat[h], all heads in one batch.
    head_projections(
        H, w.uv, 1, [&](int64_t h) { return o_lat + h * r; },
        [&](int64_t h) { return o + (t * H + h) * d.v; }, jobs);
  }
}

// A contiguous context as one page.
template <typename C>
void attend_absorbed_contiguous(const MlaDims& d, const float* q, int64_t T, const C* c_kv,
                                const C* k_rot, int64_t N, const MlaAbsorbedWeights& w, float* o,
                                float* scratch) {
  const C* cp[1] = {c_kv};
  const C* kp[1] = {k_rot};
  attend_absorbed(d, q, T, PagedRows<C>{cp, N, d.r, N}, PagedRows<C>{kp, N, d.rope, N}, w, o,
                  scratch);
}

}  // namespace

namespace {

// The carve of mla_attend_absorbed_rows' scratch: every size a multiple of 16 floats.
struct RowsScratch {
  MatmulJob* jobs;  // [H + 2 * sum of pages]
  float** base;     // [n] each row's part of `rows`
  float* qg;        // [H][n, nope] query rows gathered per head
  float* xg;        // [H][n, r] q_lat, then o_lat, rows gathered per head
  float* yg;        // [H][n, v] W_UV outputs per head
  float* rows;      // per row: q_lat [H, r], q_rot [H, rope], s_lat, s_rot [H, N], o_lat
};

int64_t round16(int64_t n) {
  return (n + 15) / 16 * 16;
}

int64_t row_floats(const MlaDims& d, int64_t N) {
  return round16(d.H * (2 * d.r + d.rope + 2 * N));
}

int64_t jobs_floats(const MlaDims& d, int64_t pages) {
  return round16((d.H + 2 * pages) *
                 static_cast<int64_t>((sizeof(MatmulJob) + sizeof(float) - 1) / sizeof(float)));
}

int64_t pointer_floats(int64_t n) {
  return round16(n * static_cast<int64_t>(sizeof(void*) / sizeof(float)));
}

RowsScratch carve_rows(const MlaDims& d, int64_t n, int64_t pages, float* s) {
  RowsScratch r;
  r.jobs = reinterpret_cast<MatmulJob*>(s);
  s += jobs_floats(d, pages);
  r.base = reinterpret_cast<float**>(s);
  s += pointer_floats(n);
  r.qg = s;
  s += round16(d.H * n * d.nope);
  r.xg = s;
  s += round16(d.H * n * d.r);
  r.yg = s;
  s += round16(d.H * n * d.v);
  r.rows = s;
  return r;
}

template <typename C>
void attend_absorbed_rows(const MlaDims& d, const AbsorbedRow<C>* rows, int64_t n,
                          const MlaAbsorbedWeights& w, float* scratch) {
  const int64_t H = d.H, r = d.r, qw = d.nope + d.rope;
  int64_t pages = 0;
  for (int64_t s = 0; s < n; ++s) pages += rows[s].c_kv.num_pages();
  const RowsScratch sc = carve_rows(d, n, pages, scratch);
  for (int64_t s = 0, off = 0; s < n; ++s) {
    sc.base[s] = sc.rows + off;
    off += row_floats(d, rows[s].c_kv.rows);
  }
  struct Parts {
    float *q_lat, *q_rot, *s_lat, *s_rot, *o_lat;
  };
  auto parts = [&](int64_t s) {
    const int64_t N = rows[s].c_kv.rows;
    float* p = sc.base[s];
    Parts q{p, p + H * r, p + H * (r + d.rope), p + H * (r + d.rope + N),
            p + H * (r + d.rope + 2 * N)};
    return q;
  };
  // q_lat of every row: each head's query rows gathered, one job per head (W_UK[h] read once for
  // all rows), the results scattered to the rows.
  for (int64_t h = 0; h < H; ++h)
    for (int64_t s = 0; s < n; ++s) {
      const float* qs = rows[s].q + h * qw;
      std::copy(qs, qs + d.nope, sc.qg + (h * n + s) * d.nope);
      std::copy(qs + d.nope, qs + qw, parts(s).q_rot + h * d.rope);
    }
  head_projections(
      H, w.uk_t, n, [&](int64_t h) { return sc.qg + h * n * d.nope; },
      [&](int64_t h) { return sc.xg + h * n * r; }, sc.jobs);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t s = 0; s < n; ++s)
      std::copy(sc.xg + (h * n + s) * r, sc.xg + (h * n + s + 1) * r, parts(s).q_lat + h * r);
  // Scores of every row against its context, one batch (a job per context page).
  int64_t nj = 0;
  for (int64_t s = 0; s < n; ++s) {
    const Parts p = parts(s);
    const int64_t N = rows[s].c_kv.rows, pr = rows[s].c_kv.page_rows;
    for (int64_t b = 0, k = 0; b < N; b += pr, ++k) {
      const int64_t m = std::min(pr, N - b);
      sc.jobs[nj] = context_job(p.q_lat, H, rows[s].c_kv.pages[k], m, r, p.s_lat + b);
      sc.jobs[nj++].ldy = N;
      if (d.rope > 0) {
        sc.jobs[nj] = context_job(p.q_rot, H, rows[s].k_rot.pages[k], m, d.rope, p.s_rot + b);
        sc.jobs[nj++].ldy = N;
      }
    }
  }
  matmul_batch(sc.jobs, nj);
  // Softmax of every (row, head), then o_lat of every (row, column block).
  const auto head_softmax = HWY_DYNAMIC_DISPATCH(HeadSoftmax);
  const auto olat_cols = olat_kernel(rows[0].c_kv.pages);
  const int64_t cbw = HWY_DYNAMIC_DISPATCH(ColumnBlockWidth)();
  const int64_t ncb = (r + cbw - 1) / cbw;
  int64_t work = 0;
  for (int64_t s = 0; s < n; ++s) work += H * rows[s].c_kv.rows * r;
  const bool parallel = work > kParallelMinWork;
  parallel_ranges(n * H, parallel, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t s = i / H, h = i % H, N = rows[s].c_kv.rows;
      const Parts p = parts(s);
      head_softmax(p.s_lat + h * N, d.rope > 0 ? p.s_rot + h * N : nullptr, N, d.scale);
    }
  });
  parallel_ranges(n * ncb, parallel, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t s = i / ncb, cb = i % ncb;
      const Parts p = parts(s);
      olat_cols(p.s_lat, H, rows[s].c_kv.rows, rows[s].c_kv.pages, rows[s].c_kv.page_rows, r,
                cb * cbw, std::min(r, (cb + 1) * cbw), p.o_lat);
    }
  });
  // o[s, h] = W_UV[h] o_lat[s, h]: all rows of a head in one job, all heads in one batch.
  for (int64_t h = 0; h < H; ++h)
    for (int64_t s = 0; s < n; ++s)
      std::copy(parts(s).o_lat + h * r, parts(s).o_lat + (h + 1) * r, sc.xg + (h * n + s) * r);
  head_projections(
      H, w.uv, n, [&](int64_t h) { return sc.xg + h * n * r; },
      [&](int64_t h) { return sc.yg + h * n * d.v; }, sc.jobs);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t s = 0; s < n; ++s)
      std::copy(sc.yg + (h * n + s) * d.v, sc.yg + (h * n + s + 1) * d.v, rows[s].o + h * d.v);
}

}  // namespace

int64_t mla_absorbed_rows_scratch_floats(const MlaDims& d, const int64_t* contexts, int64_t n,
                                         int64_t page_rows) {
  int64_t pages = 0, per_rows = 0;
  for (int64_t s = 0; s < n; ++s) {
    pages += page_rows > 0 ? (contexts[s] + page_rows - 1) / page_rows : 1;
    per_rows += row_floats(d, contexts[s]);
  }
  return jobs_floats(d, pages) + pointer_floats(n) + round16(d.H * n * d.nope) +
         round16(d.H * n * d.r) + round16(d.H * n * d.v) + per_rows;
}

void mla_attend_absorbed_rows(const MlaDims& d, const AbsorbedRow<float>* rows, int64_t n,
                              const MlaAbsorbedWeights& w, float* scratch) {
  attend_absorbed_rows(d, rows, n, w, scratch);
}

void mla_attend_absorbed_rows(const MlaDims& d, const AbsorbedRow<bf16>* rows, int64_t n,
                              const MlaAbsorbedWeights& w, float* scratch) {
  attend_absorbed_rows(d, rows, n, w, scratch);
}

void mla_attend_absorbed(const MlaDims& d, const float* q, int64_t T, const float* c_kv,
                         const float* k_rot, int64_t N, const MlaAbsorbedWeights& w, float* o,
                         float* scratch) {
  attend_absorbed_contiguous(d, q, T, c_kv, k_rot, N, w, o, scratch);
}

void mla_attend_absorbed(const MlaDims& d, const float* q, int64_t T, const bf16* c_kv,
                         const bf16* k_rot, int64_t N, const MlaAbsorbedWeights& w, float* o,
                         float* scratch) {
  attend_absorbed_contiguous(d, q, T, c_kv, k_rot, N, w, o, scratch);
}

void mla_attend_absorbed(const MlaDims& d, const float* q, int64_t T, const PagedRows<float>& c_kv,
                         const PagedRows<float>& k_rot, const MlaAbsorbedWeights& w, float* o,
                         float* scratch) {
  attend_absorbed(d, q, T, c_kv, k_rot, w, o, scratch);
}

void mla_attend_absorbed(const MlaDims& d, const float* q, int64_t T, const PagedRows<bf16>& c_kv,
                         const PagedRows<bf16>& k_rot, const MlaAbsorbedWeights& w, float* o,
                         float* scratch) {
  attend_absorbed(d, q, T, c_kv, k_rot, w, o, scratch);
}

}  // namespace attnres
#endif  // HWY_ONCE
