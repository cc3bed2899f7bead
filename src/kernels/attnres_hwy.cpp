// Fused AttnRes step (attnres.h) with Highway runtime dispatch (one copy per compiled target,
// chosen once per process; no -march flags).
//
// Per token row (the pool's threads take chunks of 8 rows from a shared counter, so a descheduled
// thread on a shared machine holds back little; one thread computes a whole row in a fixed
// order, so the result does not depend on the thread count or on which thread takes a chunk):
//   pass 1  rs' = T(rs_in + pending), stored to rs_out (and to the commit slot when it is other
//           storage); accumulates sum(rs'^2) and dot(rs', q). In bf16 two vectors of columns
//           are stored together through one shuffle (same accumulation order).
//   pass 2  dot(slot_s, q) for every committed slot (their inverse RMS comes from the commit)
//           then scores, softmax (attnres_softmax, shared with the reference). In bf16, up
//           to 8 slots share one pass over q (DotsBf16).
//   pass 3  mixture m = T(p_0 v_0 + p_1 v_1 + ...) (written as a separate multiply and add,
//           as the reference, but GCC contracts each pair into an FMA here: C++'s default
//           -ffp-contract=fast, and this file is not exempted as conv_gate_hwy.cpp is; the
//           mixture then differs from the reference's within its 1 ulp bound), stored to out;
//           accumulates sum(m^2). In bf16 the columns are taken
//           2L at a time as even and odd elements (a shift and a mask instead of a widening
//           shuffle), the same operations per element.
//   pass 4  out = T(T(m * rsqrt(mean(m^2) + eps)) * gain), in place; elementwise, so in bf16
//           also on even and odd elements (the gain split by two shuffles, or with the
//           hardware casts reordered once per call).
// Passes 2-4 re-read the row from L1/L2 (at most 9 x d elements per row), so main memory sees
// each source row once per read. While row t is computed, the rows of every source two tokens
// ahead (in this thread's order, across chunk boundaries) are prefetched, paced over all four
// passes (Prefetcher), so memory stays busy while the row is mixed and normalised.
//
// Speed (bench/attnres_read_bench.cpp): the step is close to compute-bound on one core, so the
// elementwise work is kept lean: T() is Round() below (bit-exact with CastT, fewer operations)
// and bf16 rows are loaded and stored 2L at a time. On AVX3 CPUs with AVX512_BF16 the bf16
// casts of passes 1, 3 and 4 are vcvtne2ps2bf16 (AddRowHw, MixHw, NormHw; one instruction and
// one word permutation per 32 columns instead of two Round() of 8 operations and a packing
// shuffle), bitwise the same as Round() (Cvt2: pairs with a denormal lane fall back).
// Measured one thread, rows in L2 ([4, 7168], S sources, CPU-time best-of): S = 2: 16.3 ->
// 21.3 GB/s, S = 5: 19.8 -> 22.9, S = 9: 21.8 -> 23.6 (passes 2 and 3, the per-source loads,
// shifts and multiply-adds, are most of the rest); at DRAM see the bench's header.
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
#include "util/cpu.h"
#include "util/parallel.h"

// Defined once although foreach_target.h includes this file once per target.
#ifndef ATTNRES_KERNELS_ATTNRES_HWY_ONCE_
#define ATTNRES_KERNELS_ATTNRES_HWY_ONCE_
namespace attnres {
namespace {
// attnres_set_hw_bf16_casts() (a test hook): whether the AVX512_BF16 casts may be used.
std::atomic<bool> g_hw_bf16_casts{true};
}  // namespace
}  // namespace attnres
#endif

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Software prefetch into L2 (locality hint 1) of this thread's row two tokens ahead, every
// source, paced over all four passes of the current row: Touch() is called with the work each
// loop iteration does (in units of one dot-product column) and issues the share of the lines
// that work has earned. Measured against prefetching each source's next row while its current
// row is read (passes 1 and 2 only, which leaves memory idle during passes 3 and 4) and against
// issuing all lines at once (which fills the miss buffers and stalls the compute): one thread,
// [1024, 7168] bf16, S = 9, CPU-time best-of: 13.9-15.2 GB/s per-stream, 15.7-16.2 paced one
// row ahead, 16.1-16.4 paced two rows ahead. The hardware prefetcher, which stops at 4 KiB
// pages, does not keep ~11 interleaved 14 KiB row streams ahead on its own.
constexpr int kPrefetchLocality = 1;
constexpr int kPrefetchRowsAhead = 2;

class Prefetcher {
 public:
  // Adds a source row of `bytes` bytes (all rows the same length).
  void Add(const void* row, int64_t bytes) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(row) & ~static_cast<uintptr_t>(63);
    const uintptr_t e = reinterpret_cast<uintptr_t>(row) + static_cast<uintptr_t>(bytes);
    begin_[num_rows_] = b;
    lines_ = std::max(lines_, static_cast<int64_t>((e - b + 63) / 64));
    ++num_rows_;
    total_ = lines_ * num_rows_;
  }
  // `work`: the Touch() units the current row's passes will report in all (an estimate;
  // Finish() issues whatever is left).
  void SetWork(int64_t work) { work_ = work > 0 ? work : 1; }
  HWY_INLINE void Touch(int64_t units) {
    credit_ += units * total_;
    while (credit_ >= work_ && line_ < lines_) {
      Issue();
      credit_ -= work_;
    }
  }
  void Finish() {
    while (line_ < lines_) Issue();
  }

 private:
  // Line `line_` of every row, then the next line: the order passes 2 and 3 read the rows in.
  HWY_INLINE void Issue() {
    // Integer address arithmetic: the first line may start before the row (and its
    // allocation); a prefetch never faults, but a pointer formed there would be undefined.
    __builtin_prefetch(
        reinterpret_cast<const void*>(begin_[row_] + static_cast<uintptr_t>(line_) * 64), 0,
        kPrefetchLocality);
    if (++row_ == num_rows_) {
      row_ = 0;
      ++line_;
    }
  }
  uintptr_t begin_[kMaxAttnResSources + 1];  // first line address of each row
  int num_rows_ = 0, row_ = 0;
  int64_t lines_ = 0, line_ = 0, total_ = 0, work_ = 1, credit_ = 0;
};

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

// dot(v, q) over d columns: 4 lane accumulators, then the tail. Touches pf (1 unit a column).
template <typename T>
HWY_INLINE float Dot(const T* v, const float* q, int64_t d, Prefetcher& pf) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  VF a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  int64_t j = 0;
  for (; j + 4 * N <= d; j += 4 * N) {
    pf.Touch(4 * N);
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
// accumulator per row, then the tail. Touches pf (1 unit a row element).
constexpr int kDotGroup = 8;
HWY_INLINE void DotsBf16(const bf16* const* rows, int count, const float* q, int64_t d, float* out,
                         Prefetcher& pf) {
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
    pf.Touch(count * 2 * N);
    for (int s = 0; s < count; ++s) {
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
// sum(rs'^2) and, when wanted, dot(rs', q). Touches pf (kAddWork units a column).
// Pacing weights (Touch units a column, one unit being a column of a dot product): the add
// with its cast and store, the mix's cast and store, and the norm's two casts.
constexpr int64_t kAddWork = 4;
constexpr int64_t kMixExtraWork = 2;
constexpr int64_t kNormWork = 3;

// `hw_done`: the columns [0, hw_done) were already done by AddRowHw, which left its
// accumulators in ss and dq (the loops below continue in the same order).
template <typename T>
HWY_INLINE void AddRow(const T* rs_in, const T* pending, T* rs_out, T* commit, const float* q,
                       int64_t d, float* sumsq, float* dot, Prefetcher& pf, VF ss, VF dq,
                       int64_t hw_done) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  int64_t j = hw_done;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<T, bf16>) {
    // Two vectors per iteration, accumulated in the same order as the loop below (column block
    // j, then j + N, into the same accumulators), stored together.
    for (; j + 2 * N <= d; j += 2 * N) {
      pf.Touch(2 * kAddWork * N);
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
    pf.Touch(kAddWork * N);
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

#if HWY_TARGET == HWY_AVX3
// Hardware casts (AVX512_BF16: Zen 4, Cooper Lake, Sapphire Rapids). vcvtne2ps2bf16 rounds two
// f32 vectors to 32 bf16 with round to nearest even, quiets NaN as Round() does (upper half |
// 0x0040) and overflows to inf as Round() does, but flushes denormal inputs to signed zero where
// Round() rounds them: every converted pair is tested for denormal lanes (vfpclassps) and falls
// back to Round() when it has any, so the results are bitwise those of Round(). One instruction
// replaces two Round() (8 operations each) and the packing shuffle. Highway 1.0.3 has no target
// for it: raw intrinsics under an extra target attribute (as kernels/matmul_hwy.cpp does for
// vdpbf16ps), in loops that are not inlined into the AVX3 code and run only when the CPU
// reports the feature (StepImpl).
#define ATTNRES_BF16_CVT __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

// Cvt2 without the instruction (some lane denormal; rare): words [0, 16) = T(lo), [16, 32) = T(hi).
HWY_NOINLINE __m512i Cvt2Soft(__m512 hi, __m512 lo) {
  const DF df;
  const hn::Repartition<uint16_t, DF> d16;
  const VF rl = Round<bf16>(df, VF{lo}), rh = Round<bf16>(df, VF{hi});
  return hn::ConcatOdd(d16, hn::BitCast(d16, rh), hn::BitCast(d16, rl)).raw;
}

// 32 bf16: words [0, 16) = T(lo), [16, 32) = T(hi), bitwise as Round().
ATTNRES_BF16_CVT HWY_INLINE __m512i Cvt2(__m512 hi, __m512 lo) {
  constexpr int kDenormal = 0x20;  // vfpclassps category: denormal
  const __mmask16 m = static_cast<__mmask16>(_mm512_fpclass_ps_mask(lo, kDenormal) |
                                             _mm512_fpclass_ps_mask(hi, kDenormal));
  if (HWY_LIKELY(m == 0)) return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
  return Cvt2Soft(hi, lo);
}

ATTNRES_BF16_CVT HWY_INLINE __m512i LoadWords(const uint16_t* p) {
  return _mm512_loadu_si512(p);
}

// Word permutations (vpermw indices: result word k = source word idx[k]).
// kWidenLo/kWidenHi: word 2i + 1 = word i (resp. 16 + i), so that with the even words zeroed
// lane i is the f32 of column i (resp. 16 + i) of a natural 32-column vector.
alignas(64) constexpr uint16_t kWidenLo[32] = {0, 0,  0, 1,  0, 2,  0, 3,  0, 4, 0,
                                               5, 0,  6, 0,  7, 0,  8, 0,  9, 0, 10,
                                               0, 11, 0, 12, 0, 13, 0, 14, 0, 15};
alignas(64) constexpr uint16_t kWidenHi[32] = {0,  16, 0,  17, 0,  18, 0,  19, 0,  20, 0,
                                               21, 0,  22, 0,  23, 0,  24, 0,  25, 0,  26,
                                               0,  27, 0,  28, 0,  29, 0,  30, 0,  31};
// [16 even columns | 16 odd columns] -> natural order: word 2i = i, word 2i + 1 = 16 + i.
alignas(64) constexpr uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                  21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                  11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
// Pass 4's column order after its first cast (see NormHw) -> natural: word 4m + r = 8r + m.
alignas(64) constexpr uint16_t kNormOrder[32] = {0,  8,  16, 24, 1,  9,  17, 25, 2,  10, 18,
                                                 26, 3,  11, 19, 27, 4,  12, 20, 28, 5,  13,
                                                 21, 29, 6,  14, 22, 30, 7,  15, 23, 31};
// Gain columns in that order (vpermt2ps over the 32 columns): lanes of the first product
// vector are columns 4i (i < 8) then 4(i - 8) + 1; of the second 4i + 2 then 4(i - 8) + 3.
alignas(64) constexpr uint32_t kGainA[16] = {0, 4, 8, 12, 16, 20, 24, 28,
                                             1, 5, 9, 13, 17, 21, 25, 29};
alignas(64) constexpr uint32_t kGainB[16] = {2, 6, 10, 14, 18, 22, 26, 30,
                                             3, 7, 11, 15, 19, 23, 27, 31};

// Pass 1's 2L-column loop with the hardware cast (same accumulation order as AddRow's):
// returns the first column not done.
ATTNRES_BF16_CVT HWY_NOINLINE int64_t AddRowHw(const bf16* rs_in, const bf16* pending, bf16* rs_out,
                                               bf16* commit, const float* q, int64_t d, VF* ss_io,
                                               VF* dq_io, Prefetcher& pf) {
  const DF df;
  constexpr int64_t N = 16;
  const __m512i widen_lo = _mm512_load_si512(kWidenLo), widen_hi = _mm512_load_si512(kWidenHi);
  constexpr __mmask32 kOddWords = 0xaaaaaaaau;
  VF ss = *ss_io, dq = *dq_io;
  int64_t j = 0;
  for (; j + 2 * N <= d; j += 2 * N) {
    pf.Touch(2 * kAddWork * N);
    const VF a = hn::Add(LoadF(df, rs_in + j), LoadF(df, pending + j));
    const VF b = hn::Add(LoadF(df, rs_in + j + N), LoadF(df, pending + j + N));
    const __m512i c = Cvt2(b.raw, a.raw);
    _mm512_storeu_si512(rs_out + j, c);
    if (commit) _mm512_storeu_si512(commit + j, c);
    const VF ra{_mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(kOddWords, widen_lo, c))};
    const VF rb{_mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(kOddWords, widen_hi, c))};
    ss = hn::MulAdd(ra, ra, ss);
    if (q) dq = hn::MulAdd(ra, hn::LoadU(df, q + j), dq);
    ss = hn::MulAdd(rb, rb, ss);
    if (q) dq = hn::MulAdd(rb, hn::LoadU(df, q + j + N), dq);
  }
  *ss_io = ss;
  *dq_io = dq;
  return j;
}

// Pass 3's 2L-column loop with the hardware cast (same operations and accumulation order as
// StepRow's): returns the first column not done.
ATTNRES_BF16_CVT HWY_NOINLINE int64_t MixHw(const bf16* const* rows, int n, const float* score,
                                            bf16* out, bf16* raw, int64_t d, VF* ss_io,
                                            VF* ss_odd_io, Prefetcher& pf) {
  const DF df;
  const DU du;
  constexpr int64_t N = 16;
  const auto hi_mask = hn::Set(du, 0xffff0000u);
  const __m512i interleave = _mm512_load_si512(kInterleave);
  VF ss = *ss_io, ss_odd = *ss_odd_io;
  int64_t j = 0;
  for (; j + 2 * N <= d; j += 2 * N) {
    pf.Touch((n + kMixExtraWork) * 2 * N);
    const auto r0 = hn::BitCast(du, VF{_mm512_castsi512_ps(LoadWords(&rows[0][j].bits))});
    const VF p0 = hn::Set(df, score[0]);
    VF even = hn::Mul(p0, hn::BitCast(df, hn::ShiftLeft<16>(r0)));
    VF odd = hn::Mul(p0, hn::BitCast(df, hn::And(r0, hi_mask)));
    for (int s = 1; s < n; ++s) {
      const auto r = hn::BitCast(du, VF{_mm512_castsi512_ps(LoadWords(&rows[s][j].bits))});
      const VF ps = hn::Set(df, score[s]);
      even = hn::Add(even, hn::Mul(ps, hn::BitCast(df, hn::ShiftLeft<16>(r))));
      odd = hn::Add(odd, hn::Mul(ps, hn::BitCast(df, hn::And(r, hi_mask))));
    }
    const __m512i packed = _mm512_permutexvar_epi16(interleave, Cvt2(odd.raw, even.raw));
    _mm512_storeu_si512(out + j, packed);
    if (raw) _mm512_storeu_si512(raw + j, packed);
    const auto pu = hn::BitCast(du, VF{_mm512_castsi512_ps(packed)});
    const VF me = hn::BitCast(df, hn::ShiftLeft<16>(pu)),
             mo = hn::BitCast(df, hn::And(pu, hi_mask));
    ss = hn::MulAdd(me, me, ss);
    ss_odd = hn::MulAdd(mo, mo, ss_odd);
  }
  *ss_io = ss;
  *ss_odd_io = ss_odd;
  return j;
}

// The gain of every whole 32-column block in NormHw's order: [d / 32][2][16] (per call, so
// that the rows do not gather it again).
ATTNRES_BF16_CVT HWY_NOINLINE void SplitGainHw(const float* gain, int64_t d, float* split) {
  const __m512i gain_a = _mm512_load_si512(kGainA), gain_b = _mm512_load_si512(kGainB);
  for (int64_t j = 0; j + 32 <= d; j += 32) {
    const __m512 g0 = _mm512_loadu_ps(gain + j), g1 = _mm512_loadu_ps(gain + j + 16);
    _mm512_store_ps(split + j, _mm512_permutex2var_ps(g0, gain_a, g1));
    _mm512_store_ps(split + j + 16, _mm512_permutex2var_ps(g0, gain_b, g1));
  }
}

// Pass 4's 2L-column loop with the hardware casts, in place: returns the first column not done.
// Elementwise, so the columns may travel in any order between the casts: the 32 columns are
// split by a shift and a mask (lanes: columns 2i, then 2i + 1), the first cast packs them as
// [16 even | 16 odd] words, which the same shift and mask split into columns 4i, 4i + 1 (first
// vector) and 4i + 2, 4i + 3 (second), the gain is gathered in that order, and one vpermw after
// the second cast restores the natural order.
// `split`: SplitGainHw's output, or null (then the gain is gathered here).
ATTNRES_BF16_CVT HWY_NOINLINE int64_t NormHw(bf16* out, const float* gain, const float* split,
                                             float inv, int64_t d, Prefetcher& pf) {
  const DF df;
  const DU du;
  constexpr int64_t N = 16;
  const auto hi_mask = hn::Set(du, 0xffff0000u);
  const VF vinv = hn::Set(df, inv);
  const __m512i order = _mm512_load_si512(kNormOrder);
  const __m512i gain_a = _mm512_load_si512(kGainA), gain_b = _mm512_load_si512(kGainB);
  int64_t j = 0;
  for (; j + 2 * N <= d; j += 2 * N) {
    pf.Touch(kNormWork * 2 * N);
    const auto r = hn::BitCast(du, VF{_mm512_castsi512_ps(LoadWords(&out[j].bits))});
    const VF xe = hn::Mul(hn::BitCast(df, hn::ShiftLeft<16>(r)), vinv);
    const VF xo = hn::Mul(hn::BitCast(df, hn::And(r, hi_mask)), vinv);
    const auto x = hn::BitCast(du, VF{_mm512_castsi512_ps(Cvt2(xo.raw, xe.raw))});
    VF ga, gb;
    if (split) {
      ga = VF{_mm512_load_ps(split + j)};
      gb = VF{_mm512_load_ps(split + j + N)};
    } else {
      const __m512 g0 = _mm512_loadu_ps(gain + j), g1 = _mm512_loadu_ps(gain + j + N);
      ga = VF{_mm512_permutex2var_ps(g0, gain_a, g1)};
      gb = VF{_mm512_permutex2var_ps(g0, gain_b, g1)};
    }
    const VF ya = hn::Mul(hn::BitCast(df, hn::ShiftLeft<16>(x)), ga);
    const VF yb = hn::Mul(hn::BitCast(df, hn::And(x, hi_mask)), gb);
    _mm512_storeu_si512(out + j, _mm512_permutexvar_epi16(order, Cvt2(yb.raw, ya.raw)));
  }
  return j;
}
#undef ATTNRES_BF16_CVT
#endif  // HWY_TARGET == HWY_AVX3

// One token row t of the step (passes 1-4 in the file comment). `ahead` is the row this thread
// computes kPrefetchRowsAhead rows later (-1: none); its sources are prefetched along the way.
// source's row t is read.
// `hw`: use the hardware casts (AVX3 with AVX512_BF16, bf16 only; see Cvt2), with the gain
// reordered once per call in `gain_split` (SplitGainHw; null: d too large for it).
template <typename T>
void StepRow(const AttnResStepArgs<T>& a, int64_t t, int64_t ahead, bool hw,
             const float* gain_split) {
  (void)hw;  // used on AVX3 only
  (void)gain_split;
  const int64_t d = a.dim;
  const int n = a.num_sources();
  const bool add = a.rs_in != nullptr && a.pending != nullptr;
  const bool scored = n > 1;
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const int64_t o = t * d;
  // The pacing work is the sum of the Touch() units of the passes below.
  Prefetcher pf;
  if (ahead >= 0) {
    const int64_t row_bytes = d * static_cast<int64_t>(sizeof(T));
    const int64_t oa = ahead * d;
    if (a.rs_in) pf.Add(a.rs_in + oa, row_bytes);
    if (a.pending) pf.Add(a.pending + oa, row_bytes);
    if (scored) {
      for (int s = 0; s < a.num_slots; ++s) pf.Add(a.slots[s] + oa, row_bytes);
    }
    const int64_t pass1 = add ? kAddWork : (scored ? 1 : 0);
    pf.SetWork(d * (pass1 + (scored ? a.num_slots : 0) + n + kMixExtraWork + kNormWork));
  }
  float score[kMaxAttnResSources];
  const T* rows[kMaxAttnResSources];

  // Pass 1: delayed add, commit, the running sum's statistics.
  const T* rs;
  float rs_sumsq = 0.0f, rs_dot = 0.0f;
  if (add) {
    T* commit = (a.commit && a.commit + o != a.rs_out + o) ? a.commit + o : nullptr;
    const float* q = scored ? a.query : nullptr;
    VF add_ss = hn::Zero(df), add_dq = hn::Zero(df);
    int64_t done = 0;
#if HWY_TARGET == HWY_AVX3
    if constexpr (std::is_same_v<T, bf16>) {
      if (hw) {
        done =
            AddRowHw(a.rs_in + o, a.pending + o, a.rs_out + o, commit, q, d, &add_ss, &add_dq, pf);
      }
    }
#endif
    AddRow(a.rs_in + o, a.pending + o, a.rs_out + o, commit, q, d, &rs_sumsq, &rs_dot, pf, add_ss,
           add_dq, done);
    rs = a.rs_out + o;
  } else {
    rs = (a.rs_in ? a.rs_in : a.pending) + o;
    if (a.commit && a.commit + o != rs) {
      std::memmove(a.commit + o, rs, static_cast<size_t>(d) * sizeof(T));
    }
    if (scored || a.commit) rs_sumsq = SumSq(rs, d);
    if (scored) rs_dot = Dot(rs, a.query, d, pf);
  }
  const float rs_inv_rms = attnres_inv_rms(rs_sumsq, d, a.res_eps);
  if (a.commit) a.commit_inv_rms[t] = rs_inv_rms;

  // Pass 2: scores and softmax.
  for (int s = 0; s < a.num_slots; ++s) rows[s] = a.slots[s] + o;
  rows[a.num_slots] = rs;
  if (scored) {
#if HWY_TARGET != HWY_SCALAR && !HWY_HAVE_SCALABLE
    if constexpr (std::is_same_v<T, bf16>) {
      for (int s0 = 0; s0 < a.num_slots; s0 += kDotGroup) {
        DotsBf16(rows + s0, std::min(kDotGroup, a.num_slots - s0), a.query, d, score + s0, pf);
      }
    } else {
      for (int s = 0; s < a.num_slots; ++s) score[s] = Dot(rows[s], a.query, d, pf);
    }
#else
    for (int s = 0; s < a.num_slots; ++s) score[s] = Dot(rows[s], a.query, d, pf);
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
#if HWY_TARGET == HWY_AVX3
    if (hw) j = MixHw(rows, n, score, out, raw, d, &ss, &ss_odd, pf);
#endif
    for (; j + 2 * N <= d; j += 2 * N) {
      pf.Touch((n + kMixExtraWork) * 2 * N);
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
    pf.Touch((n + kMixExtraWork) * N);
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
#if HWY_TARGET == HWY_AVX3
    if (hw) j = NormHw(out, a.norm_weight, gain_split, inv, d, pf);
#endif
    for (; j + 2 * N <= d; j += 2 * N) {
      pf.Touch(kNormWork * 2 * N);
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
    pf.Touch(kNormWork * N);
    const VF x = Round<T>(df, hn::Mul(LoadF(df, out + j), vinv));
    StoreT(df, Round<T>(df, hn::Mul(x, hn::LoadU(df, a.norm_weight + j))), out + j);
  }
  for (; j < d; ++j) {
    const float x = storage_to_f32(f32_to_storage<T>(storage_to_f32(out[j]) * inv));
    out[j] = f32_to_storage<T>(x * a.norm_weight[j]);
  }
  pf.Finish();
}

// Tokens are handed out in chunks of kChunk from a shared counter (a descheduled thread on a
// shared machine holds back one chunk, not a fixed share). A thread claims its next chunk once
// it needs to look past the current one (kPrefetchRowsAhead rows before its end), so the
// prefetch crosses chunk boundaries. Each row is computed by one thread in a fixed order: results
// do not depend on the thread count or on which thread takes a chunk.
constexpr int64_t kChunk = 8;
#if HWY_TARGET == HWY_AVX3
constexpr int64_t kGainSplitMaxDim = 8192;  // the gain table on the stack (StepImpl)
#endif

// Whether this target and CPU run the hardware casts (and the test hook allows them).
bool HwCasts() {
#if HWY_TARGET == HWY_AVX3
  return cpu_info().avx512bf16 && g_hw_bf16_casts.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

template <typename T>
void StepImpl(const AttnResStepArgs<T>& a) {
  assert(a.num_sources() >= 1 && a.num_sources() <= kMaxAttnResSources);
  assert(a.rs_in != nullptr || a.pending != nullptr);
  assert(!(a.rs_in && a.pending) || a.rs_out != nullptr);
  assert(a.commit == nullptr || a.commit_inv_rms != nullptr);
  const int64_t tokens = a.tokens;
  const bool hw = std::is_same_v<T, bf16> && HwCasts();
  // [d / 32][2][16] gain in NormHw's order; on the stack (no allocation in a kernel), so up to
  // kGainSplitMaxDim columns (the published d = 7168), above which NormHw gathers it per row.
  const float* gain_split = nullptr;
#if HWY_TARGET == HWY_AVX3
  alignas(64) float gain_split_buf[kGainSplitMaxDim];
  if (hw && a.dim <= kGainSplitMaxDim) {
    SplitGainHw(a.norm_weight, a.dim, gain_split_buf);
    gain_split = gain_split_buf;
  }
#endif
  std::atomic<int64_t> counter{0};
  const int64_t team = tokens * a.dim >= kAttnResParallelMinElements ? parallel_threads() : 1;
  parallel_tasks(team, [&](int64_t) {
    int64_t t = counter.fetch_add(kChunk, std::memory_order_relaxed);
    int64_t end = std::min(t + kChunk, tokens);
    int64_t following = -1;  // first row of this thread's next chunk; -1: not claimed yet
    // The row k rows after t in this thread's order (k <= kChunk), or -1.
    auto ahead = [&](int64_t k) -> int64_t {
      if (t + k < end) return t + k;
      if (following < 0) following = counter.fetch_add(kChunk, std::memory_order_relaxed);
      const int64_t r = following + (t + k - end);
      return r < std::min(following + kChunk, tokens) ? r : -1;
    };
    while (t < tokens) {
      StepRow(a, t, ahead(kPrefetchRowsAhead), hw, gain_split);
      ++t;
      if (t == end) {
        if (following < 0) following = counter.fetch_add(kChunk, std::memory_order_relaxed);
        t = following;
        end = std::min(t + kChunk, tokens);
        following = -1;
      }
    }
  });
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
bool AttnResHwCasts() {
  return HwCasts();
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(AttnResStepBf16);
HWY_EXPORT(AttnResStepF32);
HWY_EXPORT(AttnResChosenTarget);
HWY_EXPORT(AttnResHwCasts);

void attnres_step(const AttnResStepArgs<bf16>& a) {
  HWY_DYNAMIC_DISPATCH(AttnResStepBf16)(a);
}
void attnres_step(const AttnResStepArgs<float>& a) {
  HWY_DYNAMIC_DISPATCH(AttnResStepF32)(a);
}
bool attnres_set_hw_bf16_casts(bool enabled) {
  g_hw_bf16_casts.store(enabled, std::memory_order_relaxed);
  return HWY_DYNAMIC_DISPATCH(AttnResHwCasts)();
}
std::string attnres_target_name() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(AttnResChosenTarget)());
}

}  // namespace attnres
#endif  // HWY_ONCE
