// Fused AttnRes step (attnres.h) with Highway runtime dispatch (one copy per compiled target,
// chosen once per process; no -march flags).
//
// Per token row (OpenMP threads take chunks of 8 rows from a shared counter, so a descheduled
// thread on a shared machine holds back little; one thread computes a whole row in a fixed
// order, so the result does not depend on the thread count or on which thread takes a chunk):
//   pass 1  rs' = T(rs_in + pending), stored to rs_out (and to the commit slot when it is other
//           storage); accumulates sum(rs'^2) and dot(rs', q). In bf16 two vectors of columns
//           are stored together through one shuffle (same accumulation order).
//   pass 2  dot(slot_s, q) for every committed slot (their inverse RMS comes from the commit)
//           then scores, softmax (attnres_softmax, shared with the reference). In bf16, up
//           to 8 slots share one pass over q (DotsBf16).
//   pass 3  mixture m = T(p_0 v_0 + p_1 v_1 + ...) (separate multiply and add, as the
//           reference), stored to out; accumulates sum(m^2). In bf16 the columns are taken
//           2L at a time as even and odd elements (a shift and a mask instead of a widening
//           shuffle), the same operations per element.
//   pass 4  out = T(T(m * rsqrt(mean(m^2) + eps)) * gain), in place; elementwise, so in bf16
//           also on even and odd elements (the gain split by two shuffles).
// Passes 2-4 re-read the row from L1/L2 (at most 9 x d elements per row), so main memory sees
// each source row once per read. While a source's row t is read (passes 1 and 2), the same
// source's row for this thread's next token is prefetched; a thread claims its next chunk
// while on the last row of the current one so that the prefetch crosses chunk boundaries.
//
// Speed (bench/attnres_read_bench.cpp): the step is close to compute-bound on one core (the
// casts of passes 1, 3 and 4 dominate at d = 7168), so the elementwise work is kept lean: T()
// is Round() below (bit-exact with CastT, fewer operations) and bf16 rows are loaded and stored
// 2L at a time.
//
// Reductions (dot, sum of squares) use 4 x L lane accumulators with fused multiply-add, combined
// in a fixed order, then the scalar tail; their order depends only on (d, target).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/attnres_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/attnres.h"
#include "kernels/bf16_hwy-inl.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Software prefetch of the next token row of every stream into L2 (locality hint 1), spread
// over this row's first passes. The hardware prefetcher, which stops at 4 KiB pages, does not
// keep ~11 interleaved 14 KiB row streams ahead; measured ~20% faster at [4096, 7168].
constexpr int kPrefetchLocality = 1;
HWY_INLINE void PrefetchBytes(const void* p, size_t offset, size_t bytes) {
  const char* c = static_cast<const char*>(p) + offset;
  for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(c + b, 0, kPrefetchLocality);
}

// T(x) kept in f32, bit-exact with CastT (bf16_hwy-inl.h) and f32_to_bf16 (round to nearest
// even; NaN quieted) in fewer operations: the NaN test is one unordered compare and the final
// mask is applied once to the selected value.
template <typename T>
HWY_INLINE VF Round(DF df, VF v) {
  if constexpr (std::is_same_v<T, bf16>) {
    const DU du;
    const auto u = hn::BitCast(du, v);
    const auto rounded =
        hn::Add(u, hn::Add(hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u)), hn::Set(du, 0x7fffu)));
    const auto quiet = hn::Or(u, hn::Set(du, 0x00400000u));
    const auto sel = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, rounded);
    return hn::BitCast(df, hn::And(sel, hn::Set(du, 0xffff0000u)));
  } else {
    (void)df;
    return v;
  }
}

#if HWY_TARGET != HWY_SCALAR
// Stores 2N bf16 from two rounded vectors holding columns [0, N) and [N, 2N) in their high
// halves: one two-source shuffle instead of two narrowing stores.
HWY_INLINE void StorePair(DF df, VF lo, VF hi, bf16* p) {
  (void)df;
  const hn::Repartition<uint16_t, DF> d16;
  hn::StoreU(hn::ConcatOdd(d16, hn::BitCast(d16, hi), hn::BitCast(d16, lo)), d16,
             reinterpret_cast<uint16_t*>(p));
}
#endif

// dot(v, q) over d columns: 4 lane accumulators, then the tail. `next` (may be null) is the
// same source's next row, prefetched along the way.
template <typename T>
HWY_INLINE float Dot(const T* v, const float* q, int64_t d, const T* next = nullptr) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  int64_t j = 0;
  for (; j + 4 * N <= d; j += 4 * N) {
    if (next) PrefetchBytes(next, static_cast<size_t>(j) * sizeof(T), 4 * N * sizeof(T));
    a0 = hn::MulAdd(LoadF(df, v + j), hn::LoadU(df, q + j), a0);
    a1 = hn::MulAdd(LoadF(df, v + j + N), hn::LoadU(df, q + j + N), a1);
    a2 = hn::MulAdd(LoadF(df, v + j + 2 * N), hn::LoadU(df, q + j + 2 * N), a2);
    a3 = hn::MulAdd(LoadF(df, v + j + 3 * N), hn::LoadU(df, q + j + 3 * N), a3);
  }
  for (; j + N <= d; j += N) a0 = hn::MulAdd(LoadF(df, v + j), hn::LoadU(df, q + j), a0);
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; j < d; ++j) s += storage_to_f32(v[j]) * q[j];
  return s;
}

#if HWY_TARGET != HWY_SCALAR && !HWY_HAVE_SCALABLE
// dot(rows[s], q) for up to kDotGroup bf16 rows in one pass over the columns: q is split into
// its even and odd elements once per 2L columns (two shuffles, shared by every row) and each
// row's 2L bf16 are split by a shift and a mask, so no row element is shuffled. One
// accumulator per row, then the tail. next[s] (may be null) is prefetched along the way.
constexpr int kDotGroup = 8;
HWY_INLINE void DotsBf16(const bf16* const* rows, const bf16* const* next, int count,
                         const float* q, int64_t d, float* out) {
  const DF df;
  const DU du;
  const hn::Repartition<uint16_t, DF> d16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto hi_mask = hn::Set(du, 0xffff0000u);
  VF acc[kDotGroup];
  for (int s = 0; s < count; ++s) acc[s] = hn::Zero(df);
  int64_t j = 0;
  for (; j + 2 * N <= d; j += 2 * N) {
    const VF qa = hn::LoadU(df, q + j), qb = hn::LoadU(df, q + j + N);
    const VF qe = hn::ConcatEven(df, qb, qa), qo = hn::ConcatOdd(df, qb, qa);
    for (int s = 0; s < count; ++s) {
      if (next[s]) __builtin_prefetch(next[s] + j, 0, kPrefetchLocality);
      const auto r =
          hn::BitCast(du, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(rows[s] + j)));
      acc[s] = hn::MulAdd(hn::BitCast(df, hn::ShiftLeft<16>(r)), qe, acc[s]);
      acc[s] = hn::MulAdd(hn::BitCast(df, hn::And(r, hi_mask)), qo, acc[s]);
    }
  }
  for (int s = 0; s < count; ++s) {
    float sum = hn::GetLane(hn::SumOfLanes(df, acc[s]));
    for (int64_t k = j; k < d; ++k) sum += bf16_to_f32(rows[s][k]) * q[k];
    out[s] = sum;
  }
}
#endif

template <typename T>
HWY_INLINE float SumSq(const T* v, int64_t d) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF a0 = hn::Zero(df), a1 = hn::Zero(df);
  int64_t j = 0;
  for (; j + 2 * N <= d; j += 2 * N) {
    const VF x0 = LoadF(df, v + j), x1 = LoadF(df, v + j + N);
    a0 = hn::MulAdd(x0, x0, a0);
    a1 = hn::MulAdd(x1, x1, a1);
  }
  for (; j + N <= d; j += N) {
    const VF x = LoadF(df, v + j);
    a0 = hn::MulAdd(x, x, a0);
  }
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(a0, a1)));
  for (; j < d; ++j) {
    const float x = storage_to_f32(v[j]);
    s += x * x;
  }
  return s;
}

// Pass 1 with the add: rs' = T(rs_in + pending) to rs_out (and commit when distinct), returning
// sum(rs'^2) and, when wanted, dot(rs', q). Prefetches rs_in and pending `prefetch_stride`
// elements ahead (the next row; 0 = none).
template <typename T>
HWY_INLINE void AddRow(const T* rs_in, const T* pending, T* rs_out, T* commit, const float* q,
                       int64_t d, float* sumsq, float* dot, int64_t prefetch_stride) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF ss = hn::Zero(df), dq = hn::Zero(df);
  int64_t j = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<T, bf16>) {
    // Two vectors per iteration, accumulated in the same order as the loop below (column block
    // j, then j + N, into the same accumulators), stored together.
    for (; j + 2 * N <= d; j += 2 * N) {
      if (prefetch_stride != 0) {
        __builtin_prefetch(rs_in + j + prefetch_stride, 0, kPrefetchLocality);
        __builtin_prefetch(pending + j + prefetch_stride, 0, kPrefetchLocality);
      }
      const VF ra = Round<T>(df, hn::Add(LoadF(df, rs_in + j), LoadF(df, pending + j)));
      const VF rb = Round<T>(df, hn::Add(LoadF(df, rs_in + j + N), LoadF(df, pending + j + N)));
      StorePair(df, ra, rb, rs_out + j);
      if (commit) StorePair(df, ra, rb, commit + j);
      ss = hn::MulAdd(ra, ra, ss);
      if (q) dq = hn::MulAdd(ra, hn::LoadU(df, q + j), dq);
      ss = hn::MulAdd(rb, rb, ss);
      if (q) dq = hn::MulAdd(rb, hn::LoadU(df, q + j + N), dq);
    }
  }
#endif
  for (; j + N <= d; j += N) {
    if (prefetch_stride != 0 && (j * static_cast<int64_t>(sizeof(T))) % 64 == 0) {
      __builtin_prefetch(rs_in + j + prefetch_stride, 0, kPrefetchLocality);
      __builtin_prefetch(pending + j + prefetch_stride, 0, kPrefetchLocality);
    }
    const VF r = Round<T>(df, hn::Add(LoadF(df, rs_in + j), LoadF(df, pending + j)));
    StoreT(df, r, rs_out + j);
    if (commit) StoreT(df, r, commit + j);
    ss = hn::MulAdd(r, r, ss);
    if (q) dq = hn::MulAdd(r, hn::LoadU(df, q + j), dq);
  }
  float s = hn::GetLane(hn::SumOfLanes(df, ss));
  float p = hn::GetLane(hn::SumOfLanes(df, dq));
  for (; j < d; ++j) {
    const T rt = f32_to_storage<T>(storage_to_f32(rs_in[j]) + storage_to_f32(pending[j]));
    rs_out[j] = rt;
    if (commit) commit[j] = rt;
    const float r = storage_to_f32(rt);
    s += r * r;
    if (q) p += r * q[j];
  }
  *sumsq = s;
  *dot = p;
}

// One token row t of the step (passes 1-4 in the file comment). `next` is the row this thread
// computes after this one (-1: none); each source's row `next` is prefetched while the same
// source's row t is read.
template <typename T>
void StepRow(const AttnResStepArgs<T>& a, int64_t t, int64_t next) {
  const int64_t d = a.dim;
  const int n = a.num_sources();
  const bool add = a.rs_in != nullptr && a.pending != nullptr;
  const bool scored = n > 1;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t o = t * d;
  const int64_t stride = next >= 0 ? (next - t) * d : 0;  // elements to the next row; 0: none
  float score[kMaxAttnResSources];
  const T* rows[kMaxAttnResSources];

  // Pass 1: delayed add, commit, the running sum's statistics.
  const T* rs;
  float rs_sumsq = 0.0f, rs_dot = 0.0f;
  if (add) {
    T* commit = (a.commit && a.commit + o != a.rs_out + o) ? a.commit + o : nullptr;
    AddRow(a.rs_in + o, a.pending + o, a.rs_out + o, commit, scored ? a.query : nullptr, d,
           &rs_sumsq, &rs_dot, stride);
    rs = a.rs_out + o;
  } else {
    rs = (a.rs_in ? a.rs_in : a.pending) + o;
    if (a.commit && a.commit + o != rs) {
      std::memmove(a.commit + o, rs, static_cast<size_t>(d) * sizeof(T));
    }
    if (scored || a.commit) rs_sumsq = SumSq(rs, d);
    if (scored) rs_dot = Dot(rs, a.query, d);
  }
  const float rs_inv_rms = attnres_inv_rms(rs_sumsq, d, a.res_eps);
  if (a.commit) a.commit_inv_rms[t] = rs_inv_rms;

  // Pass 2: scores and softmax.
  for (int s = 0; s < a.num_slots; ++s) rows[s] = a.slots[s] + o;
  rows[a.num_slots] = rs;
  if (scored) {
    const T* nexts[kMaxAttnResSources];
    for (int s = 0; s < a.num_slots; ++s) nexts[s] = stride != 0 ? rows[s] + stride : nullptr;
#if HWY_TARGET != HWY_SCALAR && !HWY_HAVE_SCALABLE
    if constexpr (std::is_same_v<T, bf16>) {
      for (int s0 = 0; s0 < a.num_slots; s0 += kDotGroup) {
        DotsBf16(rows + s0, nexts + s0, std::min(kDotGroup, a.num_slots - s0), a.query, d,
                 score + s0);
      }
    } else {
      for (int s = 0; s < a.num_slots; ++s) score[s] = Dot(rows[s], a.query, d, nexts[s]);
    }
#else
    for (int s = 0; s < a.num_slots; ++s) score[s] = Dot(rows[s], a.query, d, nexts[s]);
#endif
    for (int s = 0; s < a.num_slots; ++s) score[s] *= a.slot_inv_rms[s][t];
    score[a.num_slots] = rs_dot * rs_inv_rms;
    attnres_softmax(score, n);
  } else {
    score[0] = 1.0f;
  }

  // Pass 3: mixture (cast to T) into out, and its sum of squares.
  T* out = a.out + o;
  T* raw = a.raw_mixture ? a.raw_mixture + o : nullptr;
  VF ss = hn::Zero(df);
  int64_t j = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<T, bf16>) {
    // 2N bf16 per load, split into even and odd elements by a shift and a mask (no lane
    // shuffle), mixed separately and packed back: same operations per element as below.
    const DU du;
    const hn::Repartition<uint16_t, DF> d16;
    const auto hi_mask = hn::Set(du, 0xffff0000u);
    VF ss_odd = hn::Zero(df);
    for (; j + 2 * N <= d; j += 2 * N) {
      auto raw_bits = [&](int s) {
        return hn::BitCast(du, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(rows[s] + j)));
      };
      const auto r0 = raw_bits(0);
      const VF p0 = hn::Set(df, score[0]);
      VF even = hn::Mul(p0, hn::BitCast(df, hn::ShiftLeft<16>(r0)));
      VF odd = hn::Mul(p0, hn::BitCast(df, hn::And(r0, hi_mask)));
      for (int s = 1; s < n; ++s) {
        const auto r = raw_bits(s);
        const VF ps = hn::Set(df, score[s]);
        even = hn::Add(even, hn::Mul(ps, hn::BitCast(df, hn::ShiftLeft<16>(r))));
        odd = hn::Add(odd, hn::Mul(ps, hn::BitCast(df, hn::And(r, hi_mask))));
      }
      // Rounded values have zero low halves: the odd ones are already in place.
      const VF me = Round<T>(df, even), mo = Round<T>(df, odd);
      const auto packed = hn::Or(hn::BitCast(du, mo), hn::ShiftRight<16>(hn::BitCast(du, me)));
      hn::StoreU(hn::BitCast(d16, packed), d16, reinterpret_cast<uint16_t*>(out + j));
      if (raw) hn::StoreU(hn::BitCast(d16, packed), d16, reinterpret_cast<uint16_t*>(raw + j));
      ss = hn::MulAdd(me, me, ss);
      ss_odd = hn::MulAdd(mo, mo, ss_odd);
    }
    ss = hn::Add(ss, ss_odd);
  }
#endif
  for (; j + N <= d; j += N) {
    VF acc = hn::Mul(hn::Set(df, score[0]), LoadF(df, rows[0] + j));
    for (int s = 1; s < n; ++s) {
      acc = hn::Add(acc, hn::Mul(hn::Set(df, score[s]), LoadF(df, rows[s] + j)));
    }
    const VF m = Round<T>(df, acc);
    StoreT(df, m, out + j);
    if (raw) StoreT(df, m, raw + j);
    ss = hn::MulAdd(m, m, ss);
  }
  float msq = hn::GetLane(hn::SumOfLanes(df, ss));
  for (; j < d; ++j) {
    float acc = score[0] * storage_to_f32(rows[0][j]);
    for (int s = 1; s < n; ++s) {
      const float term = score[s] * storage_to_f32(rows[s][j]);
      acc = acc + term;
    }
    const T mt = f32_to_storage<T>(acc);
    out[j] = mt;
    if (raw) raw[j] = mt;
    const float m = storage_to_f32(mt);
    msq += m * m;
  }

  // Pass 4: RMSNorm in place.
  const float inv = attnres_inv_rms(msq, d, a.norm_eps);
  const VF vinv = hn::Set(df, inv);
  j = 0;
#if HWY_TARGET != HWY_SCALAR && !HWY_HAVE_SCALABLE
  if constexpr (std::is_same_v<T, bf16>) {
    // Elementwise: 2N bf16 as even and odd elements (shift and mask), the gain split likewise.
    const DU du;
    const hn::Repartition<uint16_t, DF> d16;
    const auto hi_mask = hn::Set(du, 0xffff0000u);
    for (; j + 2 * N <= d; j += 2 * N) {
      const auto r = hn::BitCast(du, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(out + j)));
      const VF ga = hn::LoadU(df, a.norm_weight + j), gb = hn::LoadU(df, a.norm_weight + j + N);
      const VF ge = hn::ConcatEven(df, gb, ga), go = hn::ConcatOdd(df, gb, ga);
      const VF xe = Round<T>(df, hn::Mul(hn::BitCast(df, hn::ShiftLeft<16>(r)), vinv));
      const VF xo = Round<T>(df, hn::Mul(hn::BitCast(df, hn::And(r, hi_mask)), vinv));
      const VF ye = Round<T>(df, hn::Mul(xe, ge)), yo = Round<T>(df, hn::Mul(xo, go));
      const auto packed = hn::Or(hn::BitCast(du, yo), hn::ShiftRight<16>(hn::BitCast(du, ye)));
      hn::StoreU(hn::BitCast(d16, packed), d16, reinterpret_cast<uint16_t*>(out + j));
    }
  }
#endif
  for (; j + N <= d; j += N) {
    const VF x = Round<T>(df, hn::Mul(LoadF(df, out + j), vinv));
    StoreT(df, Round<T>(df, hn::Mul(x, hn::LoadU(df, a.norm_weight + j))), out + j);
  }
  for (; j < d; ++j) {
    const float x = storage_to_f32(f32_to_storage<T>(storage_to_f32(out[j]) * inv));
    out[j] = f32_to_storage<T>(x * a.norm_weight[j]);
  }
}

// Tokens are handed out in chunks of kChunk from a shared counter (a descheduled thread on a
// shared machine holds back one chunk, not a fixed share). A thread claims its next chunk while
// computing the last row of the current one, so that row can prefetch the next chunk's first
// row. Each row is computed by one thread in a fixed order: results do not depend on the thread
// count or on which thread takes a chunk.
constexpr int64_t kChunk = 8;

template <typename T>
void StepImpl(const AttnResStepArgs<T>& a) {
  assert(a.num_sources() >= 1 && a.num_sources() <= kMaxAttnResSources);
  assert(a.rs_in != nullptr || a.pending != nullptr);
  assert(!(a.rs_in && a.pending) || a.rs_out != nullptr);
  assert(a.commit == nullptr || a.commit_inv_rms != nullptr);
  const int64_t tokens = a.tokens;
  std::atomic<int64_t> counter{0};
#pragma omp parallel if (tokens * a.dim >= kAttnResParallelMinElements)
  {
    int64_t t = counter.fetch_add(kChunk, std::memory_order_relaxed);
    while (t < tokens) {
      const int64_t end = std::min(t + kChunk, tokens);
      int64_t following = tokens;  // first row of this thread's next chunk
      for (; t < end; ++t) {
        int64_t next = t + 1;
        if (next == end) {
          following = counter.fetch_add(kChunk, std::memory_order_relaxed);
          next = following < tokens ? following : -1;
        }
        StepRow(a, t, next);
      }
      t = following;
    }
  }
}

void AttnResStepBf16(const AttnResStepArgs<bf16>& a) {
  StepImpl(a);
}
void AttnResStepF32(const AttnResStepArgs<float>& a) {
  StepImpl(a);
}
int64_t AttnResChosenTarget() {
  return HWY_TARGET;
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(AttnResStepBf16);
HWY_EXPORT(AttnResStepF32);
HWY_EXPORT(AttnResChosenTarget);

void attnres_step(const AttnResStepArgs<bf16>& a) {
  HWY_DYNAMIC_DISPATCH(AttnResStepBf16)(a);
}
void attnres_step(const AttnResStepArgs<float>& a) {
  HWY_DYNAMIC_DISPATCH(AttnResStepF32)(a);
}
std::string attnres_target_name() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(AttnResChosenTarget)());
}

}  // namespace attnres
#endif  // HWY_ONCE
