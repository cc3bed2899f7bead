// Dispatched projections y = x W^T (matmul.h) with Highway runtime dispatch: one copy of the
// kernels per compiled target (AVX3 = AVX-512, AVX2, SSE4, SSSE3, SCALAR), chosen once per
// process from the CPU's features. No -march flags: foreach_target.h recompiles this file with
// per-function target attributes.
//
// Numerics (the contract the tests in tests/unit/kernels/test_matmul.cpp check):
//  - Every output y[t, n] is one dot product over k, computed by exactly one thread with L f32
//    lane accumulators (L = vector width of the chosen target): lane j accumulates
//    fma(x[k], w[k], acc) for k = j, j + L, j + 2L, ... in increasing k, then the lanes are
//    summed by the target's SumOfLanes. The tail k >= floor(K/L)*L is one more step with both
//    operands zero-padded. This sequence depends only on (K, L), never on T, N, the tile an
//    element falls in or the thread count, so results are bitwise thread-count invariant and a
//    token gives the same bits in a T = 1 (decode) call as inside a T > 1 (prefill) call.
//    Lane-packed weights (kBF16Lanes, matmul_lanes.h) and every MXFP4 job (mxfp4_lanes.h, from
//    the lane layout or from row-major codes alike) follow their own kernels' orders instead.
//  - The scalar reference (matmul_ref.cpp) accumulates sequentially in k order without fma; both
//    are within the classic bound |y - y_exact| <= gamma_K * sum_k |x_k w_k| (gamma_K ~ K u,
//    u = 2^-24), so |y - y_ref| <= (K + K/L + log2 L + 2) u sum_k |x_k w_k|; when every partial
//    sum is exactly representable (small integers, powers of two) both are exact and equal.
//  - Weights are widened exactly (bf16 -> f32 is a shift).
//
// Blocking: the output rows (N) are split over the pool's threads in whole row groups, one
// contiguous run per thread (in a batch, another thread may steal the back of a run), walked in
// blocks of ~192 KiB of weights (decode: rows shorter than a page in page-strided tiles, see
// PageStride). Inside a block, a
// group of kNR weight rows (a few KiB x K, L1/L2 resident) is applied to a register tile of up to
// kMR tokens at a time, so each weight vector loaded from memory feeds kMR FMAs and each token
// vector feeds kNR FMAs; tokens are walked in blocks whose f32 rows fit in L2. Decode (T = 1)
// streams each weight row exactly once. Products with fewer than 2^18 multiply-adds and under
// 128 KiB of weights run on the calling thread.

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kernels/bf16_hwy-inl.h"
#include "kernels/count_hwy-inl.h"
#include "kernels/matmul.h"
#include "kernels/matmul_lanes.h"
#include "kernels/mxfp4_lanes.h"
#include "util/cpu.h"
#include "util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr size_t kMaxLanes = hn::MaxLanes(DF());

// Register tiles: kMR tokens x kNR weight rows of accumulators.
#if HWY_TARGET == HWY_AVX3
// 32 registers: 4 x 6 = 24 accumulators + 6 weight vectors + 1 token vector.
constexpr int kMR = 4, kNR = 6;
#elif HWY_TARGET == HWY_SCALAR
constexpr int kMR = 2, kNR = 4;
#else
// 16 registers: 3 x 3 = 9 accumulators + 3 weight vectors + 1 token vector.
constexpr int kMR = 3, kNR = 3;
#endif

// f32 weight rows.
struct F32Rows {
  const float* w;
  int64_t N, K;
  static constexpr int64_t kBytesPerElem = 4;
  const void* Addr(int64_t n, int64_t k) const { return w + n * K + k; }
  HWY_INLINE VF Load(DF df, int64_t n, int64_t k) const { return hn::LoadU(df, w + n * K + k); }
  HWY_INLINE VF LoadTail(DF df, int64_t n, int64_t k) const {
    HWY_ALIGN float buf[kMaxLanes] = {};
    std::memcpy(buf, w + n * K + k, static_cast<size_t>(K - k) * sizeof(float));
    return hn::Load(df, buf);
  }
};

// bf16 weight rows, widened exactly (bf16 is the high half of an f32).
struct Bf16Rows {
  const uint16_t* w;
  int64_t N, K;
  static constexpr int64_t kBytesPerElem = 2;
  const void* Addr(int64_t n, int64_t k) const { return w + n * K + k; }
  HWY_INLINE VF Widen(DF df, const uint16_t* p) const {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::Rebind<uint32_t, DF> du32;
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, p))));
  }
  HWY_INLINE VF Load(DF df, int64_t n, int64_t k) const { return Widen(df, w + n * K + k); }
  HWY_INLINE VF LoadTail(DF df, int64_t n, int64_t k) const {
    HWY_ALIGN uint16_t buf[kMaxLanes] = {};
    std::memcpy(buf, w + n * K + k, static_cast<size_t>(K - k) * sizeof(uint16_t));
    return Widen(df, buf);
  }
};

// Read prefetch into L2 (not L1: the demand loads of the current tile keep L1's miss buffers).
HWY_INLINE void PrefetchL2(const void* p) {
  __builtin_prefetch(p, /*rw=*/0, /*locality=*/2);
}

// Decode GEMVs prefetch the weights a fixed distance ahead of the demand loads (two tiles of
// rows) plus this skew. Without it the distance is a whole
// number of rows, and a prefetch lands a multiple of the row size from a demand load of the same
// step. With consecutive-row tiles of 2 KiB rows (K = 1024 bf16) Zen 4 then streamed a GEMV at
// ~0.63-0.77 of a read pass of the same bytes, 0.73-0.87 with the skew; K = 2048 0.91 -> 0.96,
// K = 512 0.82 -> 0.85-0.88. (Rows under 4 KiB are now walked in page-strided tiles, see
// PageStride, which removes most of that K = 1024 loss; the skew neither helps nor hurts those.)
constexpr uintptr_t kPrefetchSkew = 1024;

// A decode tile's weight prefetch: the byte two tiles of `nr` rows `rs` apart (plus
// kPrefetchSkew) past a demand address, unless that is past the matrix's `n` rows from `base`
// (integer addresses: no pointer is formed outside the matrix). Built once per tile call.
class RowPrefetch {
 public:
  RowPrefetch(const void* base, int64_t n, int64_t row_bytes, int nr, int64_t rs)
      : ahead_(static_cast<uintptr_t>(2 * nr * rs * row_bytes) + kPrefetchSkew),
        end_(reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(n * row_bytes)) {}
  HWY_INLINE void operator()(const void* p) const {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p) + ahead_;
    if (a < end_) PrefetchL2(reinterpret_cast<const void*>(a));
  }

 private:
  uintptr_t ahead_, end_;
};

// y[m, r rs] (m < MR tokens from t0, weight rows n0 + r rs for r < NR) for dense weights; tokens
// and weights are both rows of K elements (f32 or bf16, widened exactly); y rows are ldy apart.
template <int MR, int NR, class Rows, class Tokens>
HWY_NOINLINE void DenseTile(const Tokens& xs, int64_t t0, const Rows& rows, int64_t n0, int64_t rs,
                            float* HWY_RESTRICT y, int64_t ldy) {
  const DF df;
  const int64_t K = rows.K;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  VF acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = hn::Zero(df);
  // Decode streams rows once: prefetch (into L2, one line per 64 bytes) two tiles of rows ahead
  // (plus kPrefetchSkew), so rows do not each start a cold hardware-prefetch stream (hardware
  // prefetchers stop at 4 KiB pages; a row is at most a few pages). Measured on Zen 4:
  // single-core GEMV from ~0.5-0.75 to ~0.85-1.0 of a same-size read pass.
  const RowPrefetch prefetch(rows.Addr(0, 0), rows.N, K * Rows::kBytesPerElem, NR, rs);
  int64_t k = 0;
  for (; k + L <= K; k += L) {
    if constexpr (MR == 1) {
      if (((k * Rows::kBytesPerElem) & 63) == 0)
        for (int r = 0; r < NR; ++r) prefetch(rows.Addr(n0 + r * rs, k));
    }
    VF wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = rows.Load(df, n0 + r * rs, k);
    for (int m = 0; m < MR; ++m) {
      const VF xv = xs.Load(df, t0 + m, k);
      for (int r = 0; r < NR; ++r) acc[m][r] = hn::MulAdd(xv, wv[r], acc[m][r]);
    }
  }
  if (k < K) {  // zero-padded tail step (see the header: same for every element)
    VF wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = rows.LoadTail(df, n0 + r * rs, k);
    for (int m = 0; m < MR; ++m) {
      const VF xv = xs.LoadTail(df, t0 + m, k);
      for (int r = 0; r < NR; ++r) acc[m][r] = hn::MulAdd(xv, wv[r], acc[m][r]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) y[m * ldy + r * rs] = hn::GetLane(hn::SumOfLanes(df, acc[m][r]));
}

// ------------------------------------------------------------------------------------------
// Drivers

// Calls tile(mr_const, nr_const, t, n, 1) with compile-time tile sizes for a runtime (mr, nr):
// full tiles use (TM, TN); edges use (mr, TN) or single rows.
template <int TN, int MR, class Tile>
HWY_INLINE void TileRows(const Tile& tile, int64_t t, int64_t n, int nr) {
  using M = std::integral_constant<int, MR>;
  if (nr == TN) {
    tile(M(), std::integral_constant<int, TN>(), t, n, int64_t{1});
  } else {
    for (int r = 0; r < nr; ++r) tile(M(), std::integral_constant<int, 1>(), t, n + r, int64_t{1});
  }
}

template <int TN, int MR, class Tile>
HWY_INLINE void TileAny(const Tile& tile, int64_t t, int64_t n, int mr, int nr) {
  WithCount<MR>(mr, [&](auto m) { TileRows<TN, decltype(m)::value>(tile, t, n, nr); });
}

// fn(begin, size) for each of `parts` contiguous parts of [0, n) in order, part i being
// [n i / parts, n (i + 1) / parts) (the project's balanced partition: sizes differ by at most
// one, the largest ceil(n / parts)). Token tiles split this way keep their accumulator chains
// even (9 tokens as 4 + 5 or 3 + 3 + 3, never a one-token runt).
template <class Fn>
HWY_INLINE void ForEachEqualPart(int64_t n, int64_t parts, const Fn& fn) {
  for (int64_t i = 0; i < parts; ++i) {
    const int64_t begin = n * i / parts;
    fn(begin, n * (i + 1) / parts - begin);
  }
}

// Decode (T = 1) walks weight rows shorter than a 4 KiB page in page-strided tiles: with P =
// 4096 / bytes_per_row rows to a page, a run of TN * P rows (TN pages when the matrix is
// page-aligned) is done as P tiles, tile q taking rows q, q + P, q + 2P, ... of the run. Each
// tile then streams TN pages at one offset and the next tile continues them, so every page is
// read front to back by one stream at a time. With consecutive rows in a tile, two or more
// streams share each page (K = 1024 bf16: rows at +0 and +2 KiB), which the hardware
// prefetchers do not follow: on Zen 4 that GEMV (1024 x 1024, 128 cold matrices) streamed at
// 0.76 of a read pass of the same bytes on one thread, page-strided at 0.93 (two threads, three
// matrices per batch: 0.73 -> 0.82-0.87). Only the order of rows changes, never a row's
// arithmetic.
// Returns P (1: consecutive rows) for dense weights (vdpbf16ps work: see WithDotBf16Tiles).
constexpr int64_t kPageBytes = 4096;
HWY_INLINE int64_t PageStride(int64_t T, int64_t bytes_per_row) {
  if (T != 1 || bytes_per_row <= 0 || bytes_per_row >= kPageBytes) return 1;
  return kPageBytes % bytes_per_row == 0 ? kPageBytes / bytes_per_row : 1;
}

// drive(TM, TN) (integral constants) with the register tile for T tokens of vdpbf16ps work:
// 1 x 1 at T = 1, kMR x 1 up to kMR tokens, kMR x kNR beyond; rows consecutive (P = 1).
//
// Decode on vdpbf16ps (bf16 tokens and weights), unlike the page-strided tiles above, walks its
// rows one at a time in address order (1 x 1 tiles), one sequential stream per thread as in a read
// pass; the out-of-order core overlaps consecutive rows' dot products, which are independent. On
// Zen 5 (k3-mini, two threads, five alternated pairs of `bench --reps 2 --prompt-tokens 16
// --gen-tokens 128`) the dense decode projections streamed at 0.95-1.08 of the read rate
// measured right after each run, against 0.81-0.87 with page-strided 1 x 6 tiles (decode 61-70
// against 53-58 tok/s). A step of a few sequences (T <= kMR) is memory-bound the same way and
// takes kMR x 1 tiles (2 sequences, `bench --concurrency 1,2,4`: dense projections 44.7-49.2
// against 37.8-38.7 GB/s); from T > kMR on, the 4 x 6 tiles' reuse of each weight vector wins
// (at 8 and 16 sequences 4 x 1 tiles were slower). Each row's accumulation is the same in any
// tile, so are the bits.
template <class Drive>
HWY_INLINE void WithDotBf16Tiles(int64_t T, const Drive& drive) {
  using One = std::integral_constant<int, 1>;
  using MR = std::integral_constant<int, kMR>;
  if (T == 1) {
    drive(One(), One());
  } else if (T <= kMR) {
    drive(MR(), One());
  } else {
    drive(MR(), std::integral_constant<int, kNR>());
  }
}

// Walks output rows [row_begin, row_end) of the [T, N] output (see the header) and calls
// tile(mr, nr, t, n, rs) on each register tile of rows n, n + rs, ..., n + (nr - 1) rs.
// bytes_per_row: bytes of one weight row, to size the L2-resident blocks. P: PageStride (only
// ever > 1 for T = 1); runs of TN * P rows are page-strided tiles, other rows consecutive ones.
template <int TM, int TN, class Tile>
void DriveRange(int64_t T, int64_t K, int64_t bytes_per_row, int64_t P, int64_t row_begin,
                int64_t row_end, const Tile& tile) {
  // Blocks of ~192 KiB of weight rows; tokens in blocks of ~512 KiB of f32 rows (L2), each
  // applied to every row group of the block before moving on.
  int64_t nb = std::max<int64_t>(TN * P, (192 << 10) / std::max<int64_t>(bytes_per_row, 1));
  nb = nb / (TN * P) * (TN * P);
  int64_t tb = std::max<int64_t>(TM, (512 << 10) / std::max<int64_t>(K * 4, 1));
  tb = tb / TM * TM;
  for (int64_t n_begin = row_begin; n_begin < row_end; n_begin += nb) {
    const int64_t n_end = std::min(row_end, n_begin + nb);
    int64_t n = n_begin;
    if (P > 1) {  // T = 1
      for (; n + TN * P <= n_end; n += TN * P)
        for (int64_t q = 0; q < P; ++q)
          tile(std::integral_constant<int, 1>(), std::integral_constant<int, TN>(), 0, n + q, P);
    }
    for (int64_t t0 = 0; t0 < T; t0 += tb) {
      const int64_t t_end = std::min(T, t0 + tb);
      for (int64_t m = n; m < n_end; m += TN) {
        const int nr = static_cast<int>(std::min<int64_t>(TN, n_end - m));
        for (int64_t t = t0; t < t_end; t += TM) {
          const int mr = static_cast<int>(std::min<int64_t>(TM, t_end - t));
          TileAny<TN, TM>(tile, t, m, mr, nr);
        }
      }
    }
  }
}

// Products with fewer multiply-adds than this run on the calling thread: a parallel region
// costs microseconds (much more when the machine is oversubscribed), more than ~256K
// multiply-adds take.
constexpr int64_t kParallelMinMacs = int64_t{1} << 18;
// A batch with at least this many bytes of weights runs in parallel however few multiply-adds
// it has: a decode GEMV over them is bound by one core's share of the memory stream, and the
// second core's stream more than pays for the region. KDA's f_b_proj ([1024, 128] bf16, 256 KiB,
// 131072 multiply-adds; k3-mini decode, median per batch in two alternated runs): 8.7-8.9 us on
// two threads against 13.1-13.2 us on the calling thread.
constexpr int64_t kParallelMinWeightBytes = int64_t{128} << 10;

// Whether work of `macs` multiply-adds over `weight_bytes` of weights, in `units` > 1 pieces
// that threads can take, is worth a parallel region.
HWY_INLINE bool WorthParallel(int64_t macs, int64_t weight_bytes, int64_t units) {
  return (macs >= kParallelMinMacs || weight_bytes >= kParallelMinWeightBytes) && units > 1;
}

template <int TM, int TN, class Tile>
void Drive(int64_t T, int64_t N, int64_t K, int64_t bytes_per_row, int64_t P, const Tile& tile) {
  // Static partition: thread i of n owns row groups [G i / n, G (i + 1) / n) (G groups of TN P
  // rows), a contiguous range, so threads differ by at most one group of work and each streams
  // its weights front to back. Only this partition depends on the thread count; the
  // per-element arithmetic does not (see the header).
  const int64_t g = TN * P, groups = (N + g - 1) / g;
  const bool parallel = WorthParallel(T * N * K, N * bytes_per_row, groups);
  parallel_ranges(groups, parallel, [&](int64_t g0, int64_t g1) {
    DriveRange<TM, TN>(T, K, bytes_per_row, P, g0 * g, std::min(N, g1 * g), tile);
  });
}

template <class Rows, class Tokens>
void DenseMatmul(const Tokens& xs, int64_t T, const Rows& rows, int64_t N, float* y) {
  const int64_t K = rows.K;
  const int64_t bytes_per_row = K * Rows::kBytesPerElem;
  Drive<kMR, kNR>(T, N, K, bytes_per_row, PageStride(T, bytes_per_row),
                  [&](auto mr, auto nr, int64_t t, int64_t n, int64_t rs) {
                    DenseTile<decltype(mr)::value, decltype(nr)::value>(xs, t, rows, n, rs,
                                                                        y + t * N + n, N);
                  });
}

void MatmulF32(const float* x, int64_t T, const float* w, int64_t N, int64_t K, float* y) {
  DenseMatmul(F32Rows{x, T, K}, T, F32Rows{w, N, K}, N, y);
}

void MatmulBf16(const float* x, int64_t T, const uint16_t* w, int64_t N, int64_t K, float* y) {
  DenseMatmul(F32Rows{x, T, K}, T, Bf16Rows{w, N, K}, N, y);
}

#if HWY_TARGET == HWY_AVX3
// AVX512_BF16 (Zen 4, Cooper Lake, Sapphire Rapids): vdpbf16ps adds two exact bf16 x bf16
// products per f32 lane (lane j of a 32-element step takes k = 2j + 1, then 2j), so no widening
// and twice the multiply-adds per instruction. Highway 1.0.3 has no target for it, so this is
// raw intrinsics under an extra target attribute, called only when the CPU reports the feature.
#define ATTNRES_BF16_DOT __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

ATTNRES_BF16_DOT HWY_INLINE __m512bh LoadBf16x32(const uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

// Zero-padded last step (fewer than 32 elements left).
ATTNRES_BF16_DOT HWY_INLINE __m512bh LoadBf16Tail(const uint16_t* p, int64_t n) {
  // A masked load (the elements past n are neither read nor faulted on); a copy through a
  // stack buffer instead kept the callers' accumulators in memory.
  const __mmask32 keep = static_cast<__mmask32>((uint64_t{1} << n) - 1);
  return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(keep, p));
}

// The lane sums of four accumulators, [sum a, sum b, sum c, sum d], each with exactly
// _mm512_reduce_add_ps's tree (GCC's: the 256-bit halves added, then the 128-bit quarters of
// that, then elements j and j + 2, then the last two), so the same bits (float addition is
// commutative; the pairs are the same). Four reductions share the shuffles and adds of their
// last three levels: 20 operations of at most 256 bits instead of 32.
ATTNRES_BF16_DOT HWY_INLINE __m128 ReduceAdd4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const auto half = [](__m512 v) {  // elements j + 8 and j
    return _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
  };
  const __m256 ha = half(a), hb = half(b), hc = half(c), hd = half(d);
  // [a | b] and [c | d], each quarter: elements j + 4 and j of the halves.
  const __m256 ab =
      _mm256_add_ps(_mm256_permute2f128_ps(ha, hb, 0x31), _mm256_permute2f128_ps(ha, hb, 0x20));
  const __m256 cd =
      _mm256_add_ps(_mm256_permute2f128_ps(hc, hd, 0x31), _mm256_permute2f128_ps(hc, hd, 0x20));
  // Low quarter [a0 + a2, a1 + a3, c0 + c2, c1 + c3], high quarter the same for b and d.
  const __m256 pairs =
      _mm256_add_ps(_mm256_shuffle_ps(ab, cd, 0x44), _mm256_shuffle_ps(ab, cd, 0xEE));
  // Elements 0 and 1 added (into both): [a, a, c, c | b, b, d, d].
  const __m256 sums = _mm256_add_ps(pairs, _mm256_shuffle_ps(pairs, pairs, 0xB1));
  return _mm256_castps256_ps128(
      _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 2, 6, 0, 0, 0, 0)));
}

// y[m ldy + r rs] = the lane sum of acc[m][r], _mm512_reduce_add_ps's bits, four at a time
// through ReduceAdd4. With consecutive rows (rs = 1): four rows of a token (one store) when NR
// is a multiple of 4, else tokens and rows in pairs when both counts are even ([y(m, r),
// y(m, r + 1), y(m + 1, r), y(m + 1, r + 1)], two stores of two). Otherwise the accumulators in
// (m, r) order, each sum stored alone, the last MR NR mod 4 one by one. Every loop is unrolled
// so that the accumulators stay in registers (over an array indexed in a loop it does not
// unroll, GCC keeps the whole tile in memory).
template <int MR, int NR>
ATTNRES_BF16_DOT HWY_INLINE void StoreTileSums(const __m512 (&acc)[MR][NR], float* HWY_RESTRICT y,
                                               int64_t ldy, int64_t rs) {
  if (rs == 1 && NR % 4 == 0) {
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
      for (int r = 0; r < NR; r += 4)
        _mm_storeu_ps(y + m * ldy + r,
                      ReduceAdd4(acc[m][r], acc[m][r + 1], acc[m][r + 2], acc[m][r + 3]));
    return;
  }
  if (rs == 1 && NR % 2 == 0 && MR % 2 == 0) {
#pragma GCC unroll 8
    for (int m = 0; m < MR; m += 2) {
#pragma GCC unroll 8
      for (int r = 0; r < NR; r += 2) {
        const __m128 s = ReduceAdd4(acc[m][r], acc[m][r + 1], acc[m + 1][r], acc[m + 1][r + 1]);
        _mm_storel_pi(reinterpret_cast<__m64*>(y + m * ldy + r), s);
        _mm_storeh_pi(reinterpret_cast<__m64*>(y + (m + 1) * ldy + r), s);
      }
    }
    return;
  }
  constexpr int kSums = MR * NR;
  const auto out = [&](int i) { return y + (i / NR) * ldy + (i % NR) * rs; };
#pragma GCC unroll 16
  for (int i = 0; i + 4 <= kSums; i += 4) {
    const __m128 s = ReduceAdd4(acc[i / NR][i % NR], acc[(i + 1) / NR][(i + 1) % NR],
                                acc[(i + 2) / NR][(i + 2) % NR], acc[(i + 3) / NR][(i + 3) % NR]);
    _mm_store_ss(out(i), s);
    _mm_store_ss(out(i + 1), _mm_movehdup_ps(s));
    _mm_store_ss(out(i + 2), _mm_movehl_ps(s, s));
    _mm_store_ss(out(i + 3), _mm_shuffle_ps(s, s, 3));
  }
#pragma GCC unroll 4
  for (int i = kSums / 4 * 4; i < kSums; ++i) *out(i) = _mm512_reduce_add_ps(acc[i / NR][i % NR]);
}

template <int MR, int NR>
ATTNRES_BF16_DOT HWY_NOINLINE void DotBf16Tile(const uint16_t* HWY_RESTRICT x, int64_t K,
                                               const uint16_t* HWY_RESTRICT w, int64_t N,
                                               int64_t n0, int64_t rs, float* HWY_RESTRICT y,
                                               int64_t ldy) {
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_setzero_ps();
  const RowPrefetch prefetch(w, N, K * 2, NR, rs);  // decode: as in DenseTile (one line a step)
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    if constexpr (MR == 1)
      for (int r = 0; r < NR; ++r) prefetch(w + (n0 + r * rs) * K + k);
    __m512bh wv[NR];
    for (int r = 0; r < NR; ++r) wv[r] = LoadBf16x32(w + (n0 + r * rs) * K + k);
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = LoadBf16x32(x + m * K + k);
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);
    }
  }
  if (k < K) {  // the zero-padded last step; its loops unrolled as in StoreTileSums
    __m512bh wv[NR];
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) wv[r] = LoadBf16Tail(w + (n0 + r * rs) * K + k, K - k);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = LoadBf16Tail(x + m * K + k, K - k);
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);
    }
  }
  StoreTileSums<MR, NR>(acc, y, ldy, rs);
}

#undef ATTNRES_BF16_DOT
#endif  // HWY_TARGET == HWY_AVX3

// bf16 activations. With BF16 weights on an AVX512_BF16 CPU: vdpbf16ps; otherwise the dense
// kernels with the tokens widened exactly on load (same per-element order as matmul()).
void MatmulBf16Act(const uint16_t* x, int64_t T, const void* w, bool w_bf16, int64_t N, int64_t K,
                   float* y) {
#if HWY_TARGET == HWY_AVX3
  if (w_bf16 && cpu_info().avx512bf16) {
    const auto* wb = static_cast<const uint16_t*>(w);
    const auto tile = [&](auto mr, auto nr, int64_t t, int64_t n, int64_t rs) {
      DotBf16Tile<decltype(mr)::value, decltype(nr)::value>(x + t * K, K, wb, N, n, rs,
                                                            y + t * N + n, N);
    };
    WithDotBf16Tiles(T, [&](auto tm, auto tn) {
      Drive<decltype(tm)::value, decltype(tn)::value>(T, N, K, K * 2, 1, tile);
    });
    return;
  }
#endif
  if (w_bf16) {
    DenseMatmul(Bf16Rows{x, T, K}, T, Bf16Rows{static_cast<const uint16_t*>(w), N, K}, N, y);
  } else {
    DenseMatmul(Bf16Rows{x, T, K}, T, F32Rows{static_cast<const float*>(w), N, K}, N, y);
  }
}

// ------------------------------------------------------------------------------------------
// Batches (matmul.h): one parallel region for several jobs.

// Whether job j runs on vdpbf16ps with bf16 weights (DotBf16Tile).
bool JobDotBf16(const MatmulJob& j) {
#if HWY_TARGET == HWY_AVX3
  return j.kind == WeightKind::kBF16 && j.xh != nullptr && cpu_info().avx512bf16;
#else
  (void)j;
  return false;
#endif
}

// The PageStride a job's rows are walked with: 1 for MXFP4 (its own kernels), for vdpbf16ps
// work (see WithDotBf16Tiles) and for lane-packed weights (a group is one sequential stream).
int64_t JobPageStride(const MatmulJob& j) {
  return is_mxfp4(j.kind) || j.kind == WeightKind::kBF16Lanes || JobDotBf16(j)
             ? 1
             : PageStride(j.T, job_row_bytes(j));
}

// Rows per work unit of a batch: one row group, page-strided runs kept whole.
int64_t JobGroupRows(const MatmulJob& j) {
  switch (j.kind) {
    case WeightKind::kMxfp4:  // row-major codes: packed into lane groups as they are read
    case WeightKind::kMxfp4Lanes:
      return kMxfp4LaneRows;
    case WeightKind::kBF16Lanes:
      return kLaneGroupRows;
    case WeightKind::kF32:
    case WeightKind::kBF16:
      break;
  }
  return kNR * JobPageStride(j);
}

// y[t, n] = round_bf16(y[t, n]) for t < T and n in [n0, n1).
void RoundOutputs(float* y, int64_t ldy, int64_t T, int64_t n0, int64_t n1) {
  for (int64_t t = 0; t < T; ++t) RoundSpanToBf16(y + t * ldy + n0, n1 - n0);
}

// Rows [row_begin, row_end) of job j, with exactly the tiles matmul() / mxfp4_matmul() use.
// MXFP4 reads bf16 tokens where the job has them: every token is then a bf16 value, whose
// products are the same exact f32 products as from x, so the lane kernels give the same bits
// from either (mxfp4_lanes.h).
void ComputeJobRows(const MatmulJob& j, int64_t row_begin, int64_t row_end) {
  const int64_t T = j.T, N = j.N, K = j.K, row_bytes = job_row_bytes(j), P = JobPageStride(j);
  float* y = j.y;
  const int64_t ldy = j.ldy > 0 ? j.ldy : N;
  const auto dense = [&](const auto& xs, const auto& rows) {
    DriveRange<kMR, kNR>(T, K, row_bytes, P, row_begin, row_end,
                         [&](auto mr, auto nr, int64_t t, int64_t n, int64_t rs) {
                           DenseTile<decltype(mr)::value, decltype(nr)::value>(
                               xs, t, rows, n, rs, y + t * ldy + n, ldy);
                         });
  };
  switch (j.kind) {
    case WeightKind::kF32: {
      dense(F32Rows{j.x, T, K}, F32Rows{static_cast<const float*>(j.w), N, K});
      break;
    }
    case WeightKind::kBF16: {
#if HWY_TARGET == HWY_AVX3
      if (JobDotBf16(j)) {  // bf16 x: vdpbf16ps (MatmulBf16Act)
        const auto* xh = reinterpret_cast<const uint16_t*>(j.xh);
        const auto* wb = static_cast<const uint16_t*>(j.w);
        const auto tile = [&](auto mr, auto nr, int64_t t, int64_t n, int64_t rs) {
          DotBf16Tile<decltype(mr)::value, decltype(nr)::value>(xh + t * K, K, wb, N, n, rs,
                                                                y + t * ldy + n, ldy);
        };
        WithDotBf16Tiles(T, [&](auto tm, auto tn) {  // P = 1 (JobPageStride)
          DriveRange<decltype(tm)::value, decltype(tn)::value>(T, K, row_bytes, P, row_begin,
                                                               row_end, tile);
        });
        break;
      }
#endif
      dense(F32Rows{j.x, T, K}, Bf16Rows{static_cast<const uint16_t*>(j.w), N, K});
      break;
    }
    case WeightKind::kMxfp4: {
      mxfp4_lanes_rows_row_major(j.xh, j.x, T, static_cast<const uint8_t*>(j.w), j.scale, N, K,
                                 row_begin, row_end - row_begin, y + row_begin, ldy, j.round_bf16);
      break;
    }
    case WeightKind::kMxfp4Lanes: {
      mxfp4_lanes_rows(j.xh, j.x, T, static_cast<const uint8_t*>(j.w), j.scale, N, K, row_begin,
                       row_end - row_begin, y + row_begin, ldy,
                       {.normal_scales = j.normal_scales, .round_bf16 = j.round_bf16});
      break;
    }
    case WeightKind::kBF16Lanes: {
      matmul_lanes_rows(j.xh, j.x, T, static_cast<const bf16*>(j.w), N, K, row_begin,
                        row_end - row_begin, y + row_begin, ldy, j.round_bf16);
      break;
    }
  }
}

// Whether ComputeJobRows rounds a job's outputs itself when it asks (round_bf16): the lane
// kernels and MXFP4 round each tile's outputs as they store them, which saves a pass over the
// outputs (prefill's dense and expert batches ran 1-3% faster; docs/performance.md, "bf16
// rounding in the tiles' stores"); the row-major F32 and BF16 tiles do not, so RunJobRows
// rounds theirs after them.
bool RoundsInTiles(WeightKind kind) {
  return kind == WeightKind::kBF16Lanes || kind == WeightKind::kMxfp4Lanes ||
         kind == WeightKind::kMxfp4;
}

// ComputeJobRows, then the rows' outputs rounded to bf16 when the job asks and its tiles did not
// (while the outputs are hot).
void RunJobRows(const MatmulJob& j, int64_t row_begin, int64_t row_end) {
  ComputeJobRows(j, row_begin, row_end);
  if (j.round_bf16 && !RoundsInTiles(j.kind))
    RoundOutputs(j.y, j.ldy > 0 ? j.ldy : j.N, j.T, row_begin, row_end);
}

// Runs the work units whose cumulative cost starts in [lo, hi) (see MatmulBatch).
void RunCostRange(const MatmulJob* jobs, int64_t n_jobs, int64_t lo, int64_t hi) {
  int64_t prefix = 0;  // cost of the jobs before job i
  for (int64_t i = 0; i < n_jobs && prefix < hi; ++i) {
    const MatmulJob& j = jobs[i];
    if (j.T <= 0 || j.N <= 0) continue;
    const int64_t g = JobGroupRows(j), groups = (j.N + g - 1) / g, unit = g * j.K * j.T;
    // Groups q with lo <= prefix + q * unit < hi.
    const auto first_at_or_after = [&](int64_t c) {
      return c <= prefix ? 0 : std::min(groups, (c - prefix + unit - 1) / unit);
    };
    const int64_t q0 = first_at_or_after(lo), q1 = first_at_or_after(hi);
    if (q0 < q1) RunJobRows(j, q0 * g, std::min(j.N, q1 * g));
    prefix += groups * unit;
  }
}

// A parallel batch is split by parallel_split over its cost axis: each thread streams one long
// run of rows front to back (every new run starts behind a cold prefetcher, and for MXFP4 with
// a new tile setup: with claims of remaining / (2 n) instead of remaining / n, decode on
// k3-mini was 4-7% slower and its MXFP4 expert batches 10-17%), and a thread that runs slower,
// or that the OS parks (the machine may be shared), has the back of its run taken by the other.
void MatmulBatch(const MatmulJob* jobs, int64_t n_jobs) {
  // Work unit = one row group of one job, costed T * group rows * K (multiply-adds). The units,
  // in (job, group) order, lie on a cost axis [0, total); a claim [lo, hi) runs the units whose
  // cumulative cost starts in it, a contiguous run streamed front to back. Which thread runs a
  // unit never changes its arithmetic.
  int64_t total = 0, units = 0, bytes = 0;
  for (int64_t i = 0; i < n_jobs; ++i) {
    const MatmulJob& j = jobs[i];
    if (j.T <= 0 || j.N <= 0) continue;
    const int64_t g = JobGroupRows(j);
    total += (j.N + g - 1) / g * (g * j.K * j.T);
    units += (j.N + g - 1) / g;
    bytes += job_weight_bytes(j);
  }
  if (total == 0) return;
  const int64_t nt = WorthParallel(total, bytes, units) ? parallel_threads() : 1;
  parallel_split(total, nt, [&](int64_t lo, int64_t hi) { RunCostRange(jobs, n_jobs, lo, hi); });
}

// bf16_exact_copy (matmul.h): the bit operations of its scalar twin, lane-wise; the ragged end
// through the twin.
bool Bf16ExactCopy(const float* x, int64_t n, uint16_t* out) {
  const DF d;
  const DU du;
  const DI di;
  const DU16 du16;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  auto inexact = hn::Zero(du);  // OR of the dropped low halves of the non-NaN values
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto u = hn::BitCast(du, hn::LoadU(d, x + i));
    const auto is_nan = hn::RebindMask(
        du, hn::Gt(hn::BitCast(di, hn::And(u, hn::Set(du, 0x7fffffffu))), hn::Set(di, 0x7f800000)));
    const auto hi = hn::ShiftRight<16>(u);
    const auto quiet = hn::Or(hn::And(hi, hn::Set(du, 0x8000u)), hn::Set(du, 0x7fc0u));
    inexact = hn::Or(inexact, hn::IfThenZeroElse(is_nan, hn::And(u, hn::Set(du, 0xffffu))));
    hn::StoreU(hn::DemoteTo(du16, hn::BitCast(di, hn::IfThenElse(is_nan, quiet, hi))), du16,
               out + i);
  }
  const bool tail_exact = bf16_exact_copy_ref(x + i, n - i, reinterpret_cast<bf16*>(out + i));
  return tail_exact && hn::AllTrue(du, hn::Eq(inexact, hn::Zero(du)));
}

int64_t ChosenTarget() {
  return HWY_TARGET;
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(MatmulF32);
HWY_EXPORT(MatmulBf16);
HWY_EXPORT(MatmulBf16Act);
HWY_EXPORT(ChosenTarget);
HWY_EXPORT(MatmulBatch);
HWY_EXPORT(Bf16ExactCopy);

void matmul(const float* x, int64_t T, const TensorView& W, float* y) {
  assert(W.rank() == 2 && (W.dtype == DType::kBF16 || W.dtype == DType::kF32));
  const int64_t N = W.shape[0], K = W.shape[1];
  if (T <= 0 || N <= 0) return;
  if (W.layout == Layout::kBf16Lanes) {
    matmul_lanes(x, T, W.as<bf16>(), N, K, 0, N, y, N);
  } else if (W.dtype == DType::kBF16) {
    HWY_DYNAMIC_DISPATCH(MatmulBf16)(x, T, reinterpret_cast<const uint16_t*>(W.data), N, K, y);
  } else {
    HWY_DYNAMIC_DISPATCH(MatmulF32)(x, T, W.as<float>(), N, K, y);
  }
}

void matmul_bf16(const bf16* x, int64_t T, const TensorView& W, float* y) {
  assert(W.rank() == 2 && (W.dtype == DType::kBF16 || W.dtype == DType::kF32));
  const int64_t N = W.shape[0], K = W.shape[1];
  if (T <= 0 || N <= 0) return;
  if (W.layout == Layout::kBf16Lanes)
    return matmul_bf16_lanes(x, T, W.as<bf16>(), N, K, 0, N, y, N);
  HWY_DYNAMIC_DISPATCH(MatmulBf16Act)
  (reinterpret_cast<const uint16_t*>(x), T, W.data, W.dtype == DType::kBF16, N, K, y);
}

bool matmul_bf16_uses_dot_product() {
  return cpu_info().avx512bf16 && std::string_view(matmul_simd_target()) == "AVX3";
}

bool bf16_exact_copy(const float* x, int64_t n, bf16* out) {
  return HWY_DYNAMIC_DISPATCH(Bf16ExactCopy)(x, n, reinterpret_cast<uint16_t*>(out));
}

void mxfp4_matmul(const float* x, int64_t T, const uint8_t* packed, const uint8_t* scale, int64_t N,
                  int64_t K, float* y) {
  assert(K % kMxfp4BlockSize == 0);
  const MatmulJob j = mxfp4_job(x, T, packed, scale, N, K, y);
  matmul_batch(&j, 1);
}

namespace {
// A job over a plain matrix w [N, K] of the given kind.
MatmulJob plain_job(const float* x, int64_t T, WeightKind kind, const void* w, int64_t N, int64_t K,
                    float* y) {
  MatmulJob j;
  j.x = x;
  j.T = T;
  j.kind = kind;
  j.w = w;
  j.N = N;
  j.K = K;
  j.y = y;
  return j;
}
}  // namespace

MatmulJob dense_rows_job(const float* x, int64_t T, const TensorView& W, int64_t row0, int64_t rows,
                         float* y) {
  assert(W.rank() == 2 && (W.dtype == DType::kBF16 || W.dtype == DType::kF32));
  assert(row0 >= 0 && rows >= 0 && row0 + rows <= W.shape[0]);
  const int64_t K = W.shape[1];
  if (W.layout == Layout::kBf16Lanes) {  // whole matrices only: a job's rows are whole groups
    assert(row0 == 0 && rows == W.shape[0]);
    return plain_job(x, T, WeightKind::kBF16Lanes, W.data, rows, K, y);
  }
  return plain_job(x, T, W.dtype == DType::kBF16 ? WeightKind::kBF16 : WeightKind::kF32,
                   W.data + static_cast<size_t>(row0 * K) * dtype_size(W.dtype), rows, K, y);
}

MatmulJob job_rows(const MatmulJob& j, int64_t row0, int64_t rows) {
  assert(!is_mxfp4(j.kind) && row0 >= 0 && rows >= 0 && row0 + rows <= j.N);
  assert(j.kind != WeightKind::kBF16Lanes || row0 % kLaneGroupRows == 0);
  MatmulJob part = j;
  part.w = static_cast<const std::byte*>(j.w) + row0 * job_row_bytes(j);
  part.N = rows;
  part.y = j.y + row0;
  part.ldy = j.ldy > 0 ? j.ldy : j.N;
  return part;
}

int64_t job_row_bytes(const MatmulJob& j) {
  switch (j.kind) {
    case WeightKind::kF32:
      return j.K * 4;
    case WeightKind::kBF16:
    case WeightKind::kBF16Lanes:
      return j.K * 2;
    case WeightKind::kMxfp4:
    case WeightKind::kMxfp4Lanes:
      break;
  }
  return j.K / 2 + j.K / kMxfp4BlockSize;
}

int64_t job_weight_bytes(const MatmulJob& j) {
  return j.T > 0 && j.N > 0 ? j.N * job_row_bytes(j) : 0;
}

MatmulJob dense_job(const float* x, int64_t T, const TensorView& W, float* y) {
  return dense_rows_job(x, T, W, 0, W.shape[0], y);
}

MatmulJob f32_job(const float* x, int64_t T, const float* w, int64_t N, int64_t K, float* y) {
  return plain_job(x, T, WeightKind::kF32, w, N, K, y);
}

MatmulJob bf16_job(const float* x, int64_t T, const bf16* w, int64_t N, int64_t K, float* y) {
  return plain_job(x, T, WeightKind::kBF16, w, N, K, y);
}

MatmulJob mxfp4_job(const float* x, int64_t T, const uint8_t* packed, const uint8_t* scale,
                    int64_t N, int64_t K, float* y, Layout layout) {
  assert(K % kMxfp4BlockSize == 0);
  assert(layout == Layout::kRowMajor || (layout == Layout::kMxfp4Lanes && mxfp4_lanes_fit(N, K)));
  MatmulJob j =
      plain_job(x, T, layout == Layout::kMxfp4Lanes ? WeightKind::kMxfp4Lanes : WeightKind::kMxfp4,
                packed, N, K, y);
  j.scale = scale;
  return j;
}

void matmul_batch(const MatmulJob* jobs, int64_t n_jobs) {
  if (n_jobs <= 0) return;
#ifndef NDEBUG
  for (int64_t i = 0; i < n_jobs; ++i)  // x may be null only where xh alone is read (MatmulJob)
    assert(jobs[i].x != nullptr || jobs[i].T <= 0 ||
           (jobs[i].xh != nullptr && jobs[i].kind != WeightKind::kF32 &&
            matmul_bf16_uses_dot_product()));
#endif
  HWY_DYNAMIC_DISPATCH(MatmulBatch)(jobs, n_jobs);
}

void matmul_batch_ref(const MatmulJob* jobs, int64_t n_jobs) {
  for (int64_t i = 0; i < n_jobs; ++i) {
    const MatmulJob& j = jobs[i];
    const int64_t N = j.N, K = j.K;
    for (int64_t t = 0; t < j.T; ++t) {
      const float* xr = j.x + t * K;
      for (int64_t n = 0; n < N; ++n) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
          float w = 0.0f;
          switch (j.kind) {
            case WeightKind::kF32:
              w = static_cast<const float*>(j.w)[n * K + k];
              break;
            case WeightKind::kBF16:
              w = bf16_to_f32(static_cast<const bf16*>(j.w)[n * K + k]);
              break;
            case WeightKind::kBF16Lanes:
              w = bf16_to_f32(static_cast<const bf16*>(j.w)[lanes_index(n, k, N, K)]);
              break;
            case WeightKind::kMxfp4:
              w = mxfp4_get(static_cast<const uint8_t*>(j.w) + n * (K / 2),
                            j.scale + n * (K / kMxfp4BlockSize), k);
              break;
            case WeightKind::kMxfp4Lanes:
              w = mxfp4_lanes_get(static_cast<const uint8_t*>(j.w), j.scale, n, k, K);
              break;
          }
          acc += xr[k] * w;
        }
        j.y[t * (j.ldy > 0 ? j.ldy : N) + n] = j.round_bf16 ? round_bf16(acc) : acc;
      }
    }
  }
}

const char* matmul_simd_target() {
  return hwy::TargetName(HWY_DYNAMIC_DISPATCH(ChosenTarget)());
}

}  // namespace attnres
#endif  // HWY_ONCE
