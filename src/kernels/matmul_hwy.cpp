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
//    MXFP4 on AVX3 differs only in which k a lane takes: per 32-element block b, lane j takes
//    k = 32b + 2j then 32b + 2j + 1 (the decode yields even and odd elements; see Mxfp4Tile).
//  - The scalar reference (matmul_ref.cpp) accumulates sequentially in k order without fma; both
//    are within the classic bound |y - y_exact| <= gamma_K * sum_k |x_k w_k| (gamma_K ~ K u,
//    u = 2^-24), so |y - y_ref| <= (K + K/L + log2 L + 2) u sum_k |x_k w_k|; when every partial
//    sum is exactly representable (small integers, powers of two) both are exact and equal.
//  - Weights are widened exactly (bf16 -> f32 is a shift; an MXFP4 element is the E2M1 value
//    times the E8M0 scale, or (non-AVX3 targets) the doubled E2M1 integer times 2^(s-128): the
//    same exact product as the reference's, or the same inf/NaN). Off AVX3, code 8 (-0.0)
//    decodes to +0.0: every accumulator starts at +0.0 and round-to-nearest never turns +0 into
//    -0 by adding a zero, so the sign of a zero product cannot reach y.
//
// Blocking: the output rows (N) are split over the pool's threads in whole row groups, one
// contiguous run per thread (in a batch, another thread may steal the back of a run), walked in
// blocks of ~192 KiB of weights (decode: rows shorter than a page in page-strided tiles, see
// PageStride). Inside a block, a
// group of kNR weight rows (a few KiB x K, L1/L2 resident) is applied to a register tile of up to
// kMR tokens at a time, so each weight vector loaded from memory feeds kMR FMAs and each token
// vector feeds kNR FMAs; tokens are walked in blocks whose f32 rows fit in L2. Decode (T = 1)
// streams each weight row exactly once. Products with fewer than 2^18 multiply-adds and under
// 128 KiB of weights run on the calling thread. MXFP4 rows are decoded one 32-element block at a
// time into registers (AVX3: a 16-entry f32 permute of the scaled E2M1 table indexed by the
// nibbles; other targets: a byte table lookup to twice the E2M1 value, widened to f32, times half
// the scale) and used for every token of the tile; no dequantised copy of a matrix is ever made.

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
#include "util/cpu.h"
#include "util/mxfp4_quads.h"
#include "util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

constexpr size_t kMaxLanes = hn::MaxLanes(DF());
// f32 vectors per 32-element MXFP4 block.
constexpr int kBlockVecs = static_cast<int>(kMxfp4BlockSize / kMaxLanes);

// Register tiles: kMR tokens x kNR weight rows of accumulators (dense), kMRq x kNRq for MXFP4,
// whose decoded block (kBlockVecs vectors per row) also stays in registers.
#if HWY_TARGET == HWY_AVX3
// 32 registers: dense 4 x 6 = 24 accumulators + 6 weight vectors + 1 token vector;
// MXFP4 4 x 4 = 16 accumulators + 4 rows x 2 decoded vectors + 1 token vector.
constexpr int kMR = 4, kNR = 6;
constexpr int kMRq = 4, kNRq = 4;
#elif HWY_TARGET == HWY_SCALAR
constexpr int kMR = 2, kNR = 4;
constexpr int kMRq = 2, kNRq = 4;
#elif HWY_TARGET == HWY_AVX2
// 16 registers: dense 3 x 3 = 9 accumulators + 3 weight vectors + 1 token vector;
// MXFP4 3 x 2 = 6 accumulators + 2 rows x 4 decoded vectors + 1 token vector.
constexpr int kMR = 3, kNR = 3;
constexpr int kMRq = 3, kNRq = 2;
#else
// 16 registers, 4 lanes: MXFP4 decodes 8 vectors per row, so one row at a time.
constexpr int kMR = 3, kNR = 3;
constexpr int kMRq = 4, kNRq = 1;
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
// rows for dense weights, four for MXFP4) plus this skew. Without it the distance is a whole
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
// MXFP4

// 0.5 * 2^(s - 127) = 2^(s - 128) for each E8M0 scale byte s, as an f32 (s = 0 and 1 give the
// subnormals 2^-128 and 2^-127, s = 255 NaN). Multiplying the doubled E2M1 integer by it
// reproduces kE2m1Values[code] * e8m0_to_f32(s) exactly (both are exact or both overflow to
// inf). A table, so the decode loop does one broadcast load instead of branchy integer code.
struct HalfScaleTable {
  float v[256];
};
constexpr HalfScaleTable MakeHalfScales() {
  HalfScaleTable t{};
  for (uint32_t s = 0; s < 256; ++s) {
    const uint32_t bits = s == 255 ? 0x7fc00000u : s <= 1 ? (0x00200000u << s) : (s - 1) << 23;
    t.v[s] = std::bit_cast<float>(bits);
  }
  return t;
}
constexpr HalfScaleTable kHalfScales = MakeHalfScales();

// Twice the E2M1 value of each code (exact small integers; code 8, -0.0, becomes 0).
alignas(16) constexpr int8_t kE2m1Doubled[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                                 0, -1, -2, -3, -4, -6, -8, -12};

// Decodes one 32-element block (16 packed bytes, low nibble first, scale byte s) into
// kBlockVecs f32 vectors in k order.
// (A template so that only the branch for this target's lane count is instantiated.)
template <int NV = kBlockVecs>
HWY_INLINE void DecodeBlock(const uint8_t* HWY_RESTRICT p, uint8_t s, VF* HWY_RESTRICT out) {
  const DF df;
  const VF scale = hn::Set(df, kHalfScales.v[s]);
#if HWY_TARGET == HWY_SCALAR
  for (int i = 0; i < 16; ++i) {
    const VF lo = hn::Set(df, static_cast<float>(kE2m1Doubled[p[i] & 0x0f]));
    const VF hi = hn::Set(df, static_cast<float>(kE2m1Doubled[p[i] >> 4]));
    out[2 * i] = hn::Mul(lo, scale);
    out[2 * i + 1] = hn::Mul(hi, scale);
  }
#else
  const hn::Full128<uint8_t> d8;
  const hn::Full128<int8_t> di8;
  const hn::Rebind<int32_t, DF> di32;
  const auto bytes = hn::LoadU(d8, p);
  const auto lo = hn::And(bytes, hn::Set(d8, 0x0f));  // even k
  const auto hi = hn::ShiftRight<4>(bytes);           // odd k
  const auto lut = hn::Load(di8, kE2m1Doubled);
  // Interleaving restores k order: v0 holds k = 0..15, v1 k = 16..31 (doubled E2M1 integers).
  const auto v0 = hn::TableLookupBytes(lut, hn::BitCast(di8, hn::InterleaveLower(d8, lo, hi)));
  const auto v1 = hn::TableLookupBytes(lut, hn::BitCast(di8, hn::InterleaveUpper(d8, lo, hi)));
  const auto widen = [&](auto v8) {
    return hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di32, v8)), scale);
  };
  if constexpr (NV == 2) {  // 16 lanes: each half block is one vector
    out[0] = widen(v0);
    out[1] = widen(v1);
  } else if constexpr (NV == 4) {  // 8 lanes
    const hn::Half<decltype(di8)> dh;
    out[0] = widen(hn::LowerHalf(dh, v0));
    out[1] = widen(hn::UpperHalf(dh, v0));
    out[2] = widen(hn::LowerHalf(dh, v1));
    out[3] = widen(hn::UpperHalf(dh, v1));
  } else {  // 4 lanes: through a stack buffer
    HWY_ALIGN int8_t vals[32];
    hn::Store(v0, di8, vals);
    hn::Store(v1, di8, vals + 16);
    const hn::Rebind<int8_t, DF> d8f;
    for (int j = 0; j < NV; ++j)
      out[j] = widen(hn::LoadU(d8f, vals + j * static_cast<int>(kMaxLanes)));
  }
#endif
}

// Where an MXFP4 matrix's packed codes lie: row-major, or in row quads (util/mxfp4_quads.h; a
// compile-time choice, so each layout's tiles compute their addresses as plainly as they can).
// In either layout a pair of blocks of a row (b even) is 32 contiguous bytes, so the decode of a
// pair, and every output's arithmetic, does not depend on the layout; only the addresses do.
template <bool kQuadsT>
struct Mxfp4Codes {
  static constexpr bool kQuads = kQuadsT;
  // Bytes from a row's pair of blocks to its next pair.
  static constexpr int64_t kPairStep = kQuads ? kMxfp4QuadPairBytes : 32;
  const uint8_t* p;
  int64_t K;
  HWY_INLINE const uint8_t* Row(int64_t n) const {
    return p + (kQuads ? mxfp4_quads_row_offset(n, K) : n * (K / 2));
  }
  // Block b of the row that starts at `row`.
  static HWY_INLINE const uint8_t* Block(const uint8_t* row, int64_t b) {
    return row + (b >> 1) * kPairStep + (b & 1) * 16;
  }
};

// The first tile over a group of MXFP4 rows (the only one at decode) streams them from memory:
// it prefetches the rows kMxfp4PrefetchTiles tiles ahead as it walks its own blocks (each line
// of their codes once, their scales one line per 64 blocks), as in DenseTile. Row-major: a line
// holds 4 blocks of a row. Row quads: a pair of blocks of the quad that holds the first row
// ahead is two lines; a 3-row tile's rows ahead may reach into the next quad, which the next
// tile's prefetch covers.
constexpr int kMxfp4PrefetchTiles = 4;
template <int NR, class Codes>
class Mxfp4Ahead {
 public:
  HWY_INLINE Mxfp4Ahead(const Codes& codes, const uint8_t* scale, int64_t N, int64_t n0)
      : row_bytes_(codes.K / 2), row_scales_(codes.K / kMxfp4BlockSize) {
    const int64_t n = n0 + kMxfp4PrefetchTiles * NR;
    live_ = static_cast<int>(std::clamp<int64_t>(N - n, 0, NR));
    const int64_t first = live_ > 0 ? n : 0;  // no address past the matrix
    code_ = codes.Row(Codes::kQuads ? first - first % kMxfp4QuadRows : first);
    scale_ = scale + first * row_scales_;
  }
  // Called at block b of the tile's walk.
  HWY_INLINE void operator()(int64_t b) const {
    if constexpr (Codes::kQuads) {
      if (live_ > 0 && (b & 1) == 0) {
        PrefetchL2(code_ + (b >> 1) * kMxfp4QuadPairBytes);
        PrefetchL2(code_ + (b >> 1) * kMxfp4QuadPairBytes + 64);
      }
    } else if ((b & 3) == 0) {
      for (int r = 0; r < NR && r < live_; ++r) PrefetchL2(code_ + r * row_bytes_ + b * 16);
    }
    if ((b & 63) == 0)
      for (int r = 0; r < NR && r < live_; ++r) PrefetchL2(scale_ + r * row_scales_ + b);
  }

 private:
  const uint8_t* code_;
  const uint8_t* scale_;
  int64_t row_bytes_, row_scales_;
  int live_;  // rows ahead that exist
};

// Rows [n_begin, n_end) whole (packed bytes and scales): what a run of prefetching tiles reads
// before Mxfp4Ahead's distance is reached, fetched at the run's start so its first tiles
// do not wait on memory behind a cold hardware prefetcher (each expert matrix, and each thread's
// share of a batch, starts such a run). k3-mini decode, in-model expert batches alternated in
// 8 ms windows of the same runs: 1.9-2.4% shorter (three runs).
template <class Codes>
HWY_INLINE void Mxfp4PrefetchRows(const Codes& codes, const uint8_t* scale, int64_t n_begin,
                                  int64_t n_end) {
  const int64_t row_bytes = codes.K / 2, row_scales = codes.K / kMxfp4BlockSize;
  if constexpr (Codes::kQuads) {  // the whole quads that hold the rows
    n_begin -= n_begin % kMxfp4QuadRows;
    n_end += (kMxfp4QuadRows - n_end % kMxfp4QuadRows) % kMxfp4QuadRows;
  }
  for (int64_t a = n_begin * row_bytes; a < n_end * row_bytes; a += 64) PrefetchL2(codes.p + a);
  for (int64_t a = n_begin * row_scales; a < n_end * row_scales; a += 64) PrefetchL2(scale + a);
}

#if HWY_TARGET == HWY_AVX3
// AVX-512 decode: vpermps looks up 16 f32 table entries by the low 4 bits of each 32-bit index
// and ignores the rest, so the packed bytes zero-extended to 32 bits index the even-k values
// directly, and the same bytes shifted right by 4 the odd-k values; the table is the 16 E2M1
// values times the block's E8M0 scale (exact products, as in the reference; -0.0 stays -0.0).
// One block gives even[j] = w[2j], odd[j] = w[2j + 1].
struct ScaleTable {
  float v[256];
};
constexpr ScaleTable MakeScales() {
  ScaleTable t{};
  for (uint32_t s = 0; s < 256; ++s) {
    const uint32_t bits = s == 255 ? 0x7fc00000u : s == 0 ? 0x00400000u : s << 23;
    t.v[s] = std::bit_cast<float>(bits);
  }
  return t;
}
constexpr ScaleTable kScales = MakeScales();

HWY_INLINE void DecodeBlockEvenOdd(const uint8_t* HWY_RESTRICT p, uint8_t s, __m512 values,
                                   VF& even, VF& odd) {
  const __m512 table = _mm512_mul_ps(values, _mm512_set1_ps(kScales.v[s]));
  const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  even = VF{_mm512_permutexvar_ps(bytes, table)};
  odd = VF{_mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table)};
}

// AVX3 tile: per 32-element block, each token's x is split into even and odd k (two vpermt2ps,
// shared by the NR rows) and each accumulator lane j takes k = 32b + 2j, then 32b + 2j + 1.
template <int MR, int NR, class Codes>
HWY_NOINLINE void Mxfp4Tile(const float* HWY_RESTRICT x, int64_t N, int64_t K, const Codes& codes,
                            const uint8_t* scale, int64_t n0, float* HWY_RESTRICT y, int64_t ldy) {
  const DF df;
  const int64_t row_scales = K / kMxfp4BlockSize;
  const uint8_t* rows[NR];
  for (int r = 0; r < NR; ++r) rows[r] = codes.Row(n0 + r);
  const Mxfp4Ahead<NR, Codes> ahead(codes, scale, N, n0);
  const __m512 values = _mm512_loadu_ps(kE2m1Values);
  const __m512i even_idx =
      _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd_idx =
      _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  VF acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = hn::Zero(df);
  for (int64_t b = 0; b < row_scales; ++b) {
    if constexpr (MR == 1) ahead(b);
    VF we[NR], wo[NR];
    for (int r = 0; r < NR; ++r)
      DecodeBlockEvenOdd(codes.Block(rows[r], b), scale[(n0 + r) * row_scales + b], values, we[r],
                         wo[r]);
    const float* xb = x + b * kMxfp4BlockSize;
    for (int m = 0; m < MR; ++m) {
      const __m512 x0 = _mm512_loadu_ps(xb + m * K), x1 = _mm512_loadu_ps(xb + m * K + 16);
      const VF xe{_mm512_permutex2var_ps(x0, even_idx, x1)};
      const VF xo{_mm512_permutex2var_ps(x0, odd_idx, x1)};
      for (int r = 0; r < NR; ++r) {
        acc[m][r] = hn::MulAdd(xe, we[r], acc[m][r]);
        acc[m][r] = hn::MulAdd(xo, wo[r], acc[m][r]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) y[m * ldy + r] = hn::GetLane(hn::SumOfLanes(df, acc[m][r]));
}

#else  // other targets: decode to k-ordered vectors

template <int MR, int NR, class Codes>
HWY_NOINLINE void Mxfp4Tile(const float* HWY_RESTRICT x, int64_t N, int64_t K, const Codes& codes,
                            const uint8_t* scale, int64_t n0, float* HWY_RESTRICT y, int64_t ldy) {
  const DF df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df));
  const int64_t row_scales = K / kMxfp4BlockSize;
  const uint8_t* rows[NR];
  for (int r = 0; r < NR; ++r) rows[r] = codes.Row(n0 + r);
  const Mxfp4Ahead<NR, Codes> ahead(codes, scale, N, n0);
  VF acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = hn::Zero(df);
  for (int64_t b = 0; b < row_scales; ++b) {
    if constexpr (MR == 1) ahead(b);
    VF wv[NR][kBlockVecs];  // decoded block of each row
    for (int r = 0; r < NR; ++r)
      DecodeBlock(codes.Block(rows[r], b), scale[(n0 + r) * row_scales + b], wv[r]);
    const float* xb = x + b * kMxfp4BlockSize;
    for (int j = 0; j < kBlockVecs; ++j) {
      for (int m = 0; m < MR; ++m) {
        const VF xv = hn::LoadU(df, xb + m * K + j * L);
        for (int r = 0; r < NR; ++r) acc[m][r] = hn::MulAdd(xv, wv[r][j], acc[m][r]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) y[m * ldy + r] = hn::GetLane(hn::SumOfLanes(df, acc[m][r]));
}

#endif  // HWY_TARGET == HWY_AVX3

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

// bf16 tokens with MXFP4 weights, two 32-element blocks (b, b + 1) of a row at a time: the 16
// E2M1 values times each block's E8M0 scale (exact f32 products, as in Mxfp4Tile) are converted
// to bf16 (exact: at most two significant bits and the f32 exponent range; except that
// vcvtne2ps2bf16 flushes the subnormal products of scale bytes 0 and 1 to zero, as vdpbf16ps
// flushes subnormal inputs) into one 32-word table, block b's values in words 0-15 and block
// b + 1's in words 16-31. The 32 packed bytes, zero-extended to words, index it: the low
// nibble of byte i (element 2i of the pair of blocks) plus 16 for the second block gives the
// even elements, the high nibble (element 2i + 1) the odd ones. The tokens' 64 bf16 values are
// split the same way (even / odd elements, two vpermt2w shared by the NR rows). Lane j thus
// takes, per pair of blocks, elements 4j + 2 and 4j (one vdpbf16ps), then 4j + 3 and 4j + 1;
// an odd last block (K / 32 odd) is one more step with the single-block decode below.
ATTNRES_BF16_DOT HWY_INLINE __m512i ScaledBf16Table(__m512 values, uint8_t s0, uint8_t s1) {
  const __m512 t0 = _mm512_mul_ps(values, _mm512_set1_ps(kScales.v[s0]));
  const __m512 t1 = _mm512_mul_ps(values, _mm512_set1_ps(kScales.v[s1]));
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(t1, t0));  // words 0-15: t0, 16-31: t1
}

// ScaledBf16Table(values, s, s)'s low 16 words for every scale byte s (8 KiB, L1-resident),
// built once with that function, so a pair's table is two 32-byte loads instead of two
// multiplies and a conversion per row.
struct alignas(64) ScaledBf16Tables {
  uint16_t w[256][16];
};
ATTNRES_BF16_DOT const ScaledBf16Tables& ScaledTables() {
  static const ScaledBf16Tables t = [] {
    ScaledBf16Tables r;
    const __m512 values = _mm512_loadu_ps(kE2m1Values);
    for (int s = 0; s < 256; ++s) {
      const __m512i v = ScaledBf16Table(values, static_cast<uint8_t>(s), static_cast<uint8_t>(s));
      _mm256_store_si256(reinterpret_cast<__m256i*>(r.w[s]), _mm512_castsi512_si256(v));
    }
    return r;
  }();
  return t;
}

// Words 0-15: block scale s0's table, 16-31: s1's (as ScaledBf16Table(values, s0, s1)).
ATTNRES_BF16_DOT HWY_INLINE __m512i PairTable(const ScaledBf16Tables& t, uint8_t s0, uint8_t s1) {
  const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.w[s0]));
  const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.w[s1]));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// One block alone (the odd last block): lane j takes the pair (w[2j], w[2j + 1]) = the nibbles
// of byte j. With the byte zero-extended to 32 bits as d, d | (d << 12) holds the low nibble in
// the low word's index bits (bit 4 may hold the high nibble's low bit: the table holds the
// block twice, so it is irrelevant) and the high nibble in the high word's.
ATTNRES_BF16_DOT HWY_INLINE __m512bh DecodeBlockBf16(const uint8_t* HWY_RESTRICT p, uint8_t s,
                                                     __m512 values) {
  const __m512i table = ScaledBf16Table(values, s, s);
  const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i idx = _mm512_or_si512(d, _mm512_slli_epi32(d, 12));
  return reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(idx, table));
}

// The index vectors of a pair of blocks. Word i: 2i (even elements of 64 tokens' values) / 2i + 1
// (odd) for the tokens; 16 for the second block's half of the weight table.
struct PairIndex {
  __m512i even_idx, odd_idx, second, low4;
};
ATTNRES_BF16_DOT HWY_INLINE PairIndex MakePairIndex() {
  alignas(64) static constexpr uint16_t kEvenIdx[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20,
                                                        22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42,
                                                        44, 46, 48, 50, 52, 54, 56, 58, 60, 62};
  alignas(64) static constexpr uint16_t kOddIdx[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                       23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                       45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  alignas(64) static constexpr uint16_t kSecond[32] = {0,  0,  0,  0,  0,  0,  0,  0,  0,  0,  0,
                                                       0,  0,  0,  0,  0,  16, 16, 16, 16, 16, 16,
                                                       16, 16, 16, 16, 16, 16, 16, 16, 16, 16};
  return {_mm512_load_si512(kEvenIdx), _mm512_load_si512(kOddIdx), _mm512_load_si512(kSecond),
          _mm512_set1_epi16(0x0f)};
}

// A token's 64 bf16 values of the pair of blocks at p, split into even and odd elements.
ATTNRES_BF16_DOT HWY_INLINE void SplitTokenPair(const uint16_t* HWY_RESTRICT p, const PairIndex& ix,
                                                __m512bh& xe, __m512bh& xo) {
  const __m512i x0 = _mm512_loadu_si512(p);
  const __m512i x1 = _mm512_loadu_si512(p + 32);
  xe = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(x0, ix.even_idx, x1));
  xo = reinterpret_cast<__m512bh>(_mm512_permutex2var_epi16(x0, ix.odd_idx, x1));
}

// Blocks b and b + 1 (b even) of a row (the pair's 32 packed bytes, and the row's scales)
// decoded to bf16: we holds the even elements, wo the odd ones, in the lanes SplitTokenPair puts
// the tokens' values.
ATTNRES_BF16_DOT HWY_INLINE void DecodePairBf16(const uint8_t* HWY_RESTRICT pair,
                                                const uint8_t* HWY_RESTRICT scale_row, int64_t b,
                                                const ScaledBf16Tables& tables, const PairIndex& ix,
                                                __m512bh& we, __m512bh& wo) {
  const __m512i table = PairTable(tables, scale_row[b], scale_row[b + 1]);
  const __m512i w =
      _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pair)));
  // (w & 0x0f) | second, and (w >> 4) | second (w < 256, so w >> 4 < 16)
  const __m512i ie = _mm512_ternarylogic_epi32(w, ix.low4, ix.second, 0xEA);
  const __m512i io = _mm512_or_si512(_mm512_srli_epi16(w, 4), ix.second);
  we = reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(ie, table));
  wo = reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(io, table));
}

// bf16 tokens with MXFP4 weights, any T: the tokens are split once into the even/odd layout
// (a pair of blocks at words 32b..32b+63: its 32 even then its 32 odd elements, as
// SplitTokenPair gives them; an odd last block as it is), so every output is the vdpbf16ps
// sequence even half, odd half per pair of blocks in k order, then the odd block, on the
// decoded weights in the same layout (DecodePairBf16, DecodeBlockBf16): the same bits whichever
// tile or path (Mxfp4SplitTile, or DotBf16Tile over rows decoded into a buffer) computes it, for
// a token alone (decode) as inside a prefill.
ATTNRES_BF16_DOT HWY_INLINE void SplitTokens(const uint16_t* HWY_RESTRICT x, int64_t T, int64_t K,
                                             const PairIndex& ix, uint16_t* HWY_RESTRICT out) {
  const int64_t blocks = K / kMxfp4BlockSize;
  for (int64_t t = 0; t < T; ++t) {
    const uint16_t* xr = x + t * K;
    uint16_t* o = out + t * K;
    int64_t b = 0;
    for (; b + 2 <= blocks; b += 2) {
      __m512bh xe, xo;
      SplitTokenPair(xr + b * kMxfp4BlockSize, ix, xe, xo);
      _mm512_storeu_si512(o + b * kMxfp4BlockSize, reinterpret_cast<__m512i>(xe));
      _mm512_storeu_si512(o + b * kMxfp4BlockSize + 32, reinterpret_cast<__m512i>(xo));
    }
    if (b < blocks)
      std::memcpy(o + b * kMxfp4BlockSize, xr + b * kMxfp4BlockSize,
                  kMxfp4BlockSize * sizeof(uint16_t));
  }
}

// Rows n0 .. n0 + nr - 1 of the N decoded into out; each row's packed bytes and scales one row
// group (nr rows) ahead are prefetched meanwhile, so the next call finds its rows in L2 (the
// tiles that use a group's rows read no memory, which leaves the hardware prefetcher idle).
template <class Codes>
ATTNRES_BF16_DOT HWY_INLINE void DecodeRowsBf16(const Codes& codes, const uint8_t* scale, int64_t N,
                                                int64_t n0, int nr, const ScaledBf16Tables& tables,
                                                const PairIndex& ix, uint16_t* HWY_RESTRICT out) {
  const int64_t K = codes.K, row_scales = K / kMxfp4BlockSize;
  const __m512 values = _mm512_loadu_ps(kE2m1Values);
  for (int r = 0; r < nr; ++r) {
    const uint8_t* pr = codes.Row(n0 + r);
    const uint8_t* sr = scale + (n0 + r) * row_scales;
    uint16_t* o = out + r * K;
    const bool ahead = n0 + nr + r < N;
    // Each line of the row a group ahead once: row-major every 4 blocks; in row quads every
    // pair, by the even row of the two that share the line.
    const uint8_t* pr_ahead = ahead ? codes.Row(n0 + nr + r) : pr;
    const bool fetch = ahead && (!Codes::kQuads || (n0 + nr + r) % 2 == 0);
    constexpr int64_t kMask = Codes::kQuads ? 1 : 3;
    int64_t b = 0;
    for (; b + 2 <= row_scales; b += 2) {
      if (fetch && (b & kMask) == 0) PrefetchL2(codes.Block(pr_ahead, b));
      if (ahead && (b & 63) == 0) PrefetchL2(sr + nr * row_scales + b);
      __m512bh we, wo;
      DecodePairBf16(codes.Block(pr, b), sr, b, tables, ix, we, wo);
      _mm512_storeu_si512(o + b * kMxfp4BlockSize, reinterpret_cast<__m512i>(we));
      _mm512_storeu_si512(o + b * kMxfp4BlockSize + 32, reinterpret_cast<__m512i>(wo));
    }
    if (b < row_scales)
      _mm512_storeu_si512(o + b * kMxfp4BlockSize, reinterpret_cast<__m512i>(DecodeBlockBf16(
                                                       codes.Block(pr, b), sr[b], values)));
  }
}

// Register tiles over tokens already split (SplitTokens' layout): MR tokens x NR rows, each
// pair of blocks of the NR rows decoded into registers once and applied to all MR tokens, whose
// even and odd halves are plain loads. A row's decode (~7 vector operations per pair of blocks)
// is thus shared by up to 7 tokens (14 vdpbf16ps), which suits prefill experts with a few tokens
// each (k3-mini, 256-token chunk: mostly 4-15); decode is the 1 x 4 tile. kPrefetch: the
// first tile over its rows, the one that streams them from memory, prefetches them ahead, whatever
// its shape. Cold experts [512, 1024] (BM_GemmMxfp4ExpertsBf16Act/E:64, alternated runs): 8
// tokens in 4 x 4 tiles at 0.29 of the vdpbf16ps peak without it against 0.53-0.57; 6 and 7
// tokens in 3-row tiles at 0.36-0.47 and 0.29-0.35 without it against 0.56-0.60 and 0.57-0.74.
// 7 x 3 (21 accumulators + 6 decoded vectors + 2 token vectors + the decode's temporaries)
// decodes a row per 7 tokens instead of 8 x 2's 8, but keeps 21 independent vdpbf16ps chains
// instead of 16.
constexpr int kMRs = 7, kNRs = 3;
template <int MR, int NR, bool kPrefetch, class Codes>
ATTNRES_BF16_DOT HWY_INLINE void Mxfp4SplitGroup(const uint16_t* HWY_RESTRICT xs, int64_t N,
                                                 const Codes& codes, const uint8_t* scale,
                                                 int64_t n0, const ScaledBf16Tables& tables,
                                                 const PairIndex& ix, float* HWY_RESTRICT y,
                                                 int64_t ldy) {
  const int64_t K = codes.K, row_scales = K / kMxfp4BlockSize;
  const uint8_t* rows[NR];
  for (int r = 0; r < NR; ++r) rows[r] = codes.Row(n0 + r);
  const Mxfp4Ahead<NR, Codes> ahead(codes, scale, N, n0);  // used by the prefetching tile only
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= row_scales; b += 2) {
    if constexpr (kPrefetch) ahead(b);
    __m512bh we[NR], wo[NR];
    for (int r = 0; r < NR; ++r)
      DecodePairBf16(rows[r] + (b >> 1) * Codes::kPairStep, scale + (n0 + r) * row_scales, b,
                     tables, ix, we[r], wo[r]);
    for (int m = 0; m < MR; ++m) {
      const __m512bh xe = LoadBf16x32(xs + m * K + b * kMxfp4BlockSize);
      const __m512bh xo = LoadBf16x32(xs + m * K + b * kMxfp4BlockSize + 32);
      for (int r = 0; r < NR; ++r) {
        acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xe, we[r]);
        acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xo, wo[r]);
      }
    }
  }
  if (b < row_scales) {  // the odd last block; its loops unrolled as in StoreTileSums
    const __m512 values = _mm512_loadu_ps(kE2m1Values);
    __m512bh wv[NR];
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r)
      wv[r] = DecodeBlockBf16(codes.Block(rows[r], b), scale[(n0 + r) * row_scales + b], values);
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = LoadBf16x32(xs + m * K + b * kMxfp4BlockSize);
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);
    }
  }
  StoreTileSums<MR, NR>(acc, y, ldy, 1);
}

template <int MR, int NR, bool kPrefetch, class Codes>
ATTNRES_BF16_DOT HWY_NOINLINE void Mxfp4SplitTile(const uint16_t* HWY_RESTRICT xs, int64_t N,
                                                  const Codes& codes, const uint8_t* scale,
                                                  int64_t n0, float* HWY_RESTRICT y, int64_t ldy) {
  Mxfp4SplitGroup<MR, NR, kPrefetch>(xs, N, codes, scale, n0, ScaledTables(), MakePairIndex(), y,
                                     ldy);
}

// `groups` consecutive tiles of NR rows from n_begin in one call: the tables, index vectors and
// call set up once, where a tile at K = 512 is only 8 pairs of blocks. For tiles of at most 4
// tokens (decode among them); one thread, 4 experts [512, 512] in L2: 1 token 4.08-4.13 against
// 4.72-4.85 cycles per pair of blocks and row, 3 tokens 1.96-2.04 against 2.55-2.64 per token.
// Tiles of more tokens keep one call per tile: with the loop around them the 5-7-token tiles
// ran slower (7 x 3: 1.83-2.16 against 1.62-1.63 per token).
template <int MR, int NR, bool kPrefetch, class Codes>
ATTNRES_BF16_DOT HWY_NOINLINE void Mxfp4SplitTiles(const uint16_t* HWY_RESTRICT xs, int64_t N,
                                                   const Codes& codes, const uint8_t* scale,
                                                   int64_t n_begin, int64_t groups,
                                                   float* HWY_RESTRICT y, int64_t ldy) {
  const ScaledBf16Tables& tables = ScaledTables();
  const PairIndex ix = MakePairIndex();
  for (int64_t g = 0; g < groups; ++g)
    Mxfp4SplitGroup<MR, NR, kPrefetch>(xs, N, codes, scale, n_begin + g * NR, tables, ix,
                                       y + g * NR, ldy);
}

// Rows [row_begin, row_end) for the tn split tokens at xs (token rows t0.. of y) in
// Mxfp4SplitTile tiles. Tokens in near-equal sub-blocks whose split values stay in L1 (at most
// 16 KiB, or kMRs tokens) while the rows stream past; a sub-block in ceil(n / kMRs) tiles of
// near-equal size (8 tokens as 4 + 4, not 7 + 1: a tile's accumulators are its independent
// vdpbf16ps chains), with 4 rows a tile when the tiles hold at most 5 tokens and kNRs rows
// otherwise (register budget). 5 tokens take 5 x 4 tiles (one thread, one [512, 512] expert in
// L2: 0.55-0.56 of the peak against 0.34-0.35 for 5 x 3; 6 x 4 tiles ran 0.48 against 6 x 3's
// 0.52-0.53).
template <class Codes>
ATTNRES_BF16_DOT void Mxfp4SplitRows(const uint16_t* xs, int64_t tn, int64_t t0, int64_t N,
                                     const Codes& codes, const uint8_t* scale, int64_t row_begin,
                                     int64_t row_end, float* y, int64_t ldy) {
  const int64_t K = codes.K;
  const int64_t tl = std::max<int64_t>(kMRs, (16 << 10) / (K * 2));
  const auto tile = [&](auto mr, auto nrc, int64_t t, int64_t n, int64_t /*rs = 1*/) {
    constexpr int MR = decltype(mr)::value, NR = decltype(nrc)::value;
    float* yt = y + (t0 + t) * ldy + n;
    if (t0 + t == 0)  // the first tile over the rows prefetches
      Mxfp4SplitTile<MR, NR, true>(xs + t * K, N, codes, scale, n, yt, ldy);
    else
      Mxfp4SplitTile<MR, NR, false>(xs + t * K, N, codes, scale, n, yt, ldy);
  };
  ForEachEqualPart(tn, (tn + tl - 1) / tl, [&](int64_t t1, int64_t m) {  // sub-blocks
    const int64_t tiles = (m + kMRs - 1) / kMRs, largest = (m + tiles - 1) / tiles;
    // Tiles of NR rows and at most MRmax tokens (compile-time tile sizes).
    const auto rows = [&](auto nrc, auto mr_max) {
      constexpr int NR = decltype(nrc)::value, MRmax = decltype(mr_max)::value;
      if (t0 + t1 == 0)  // the prefetching tiles' run starts here
        Mxfp4PrefetchRows(codes, scale, row_begin,
                          std::min(row_end, row_begin + kMxfp4PrefetchTiles * NR));
      int64_t n = row_begin;
      if constexpr (NR == 4 && MRmax == 4) {
        if (tiles == 1) {  // one tile of at most 4 tokens (decode among them): one call
          const int64_t groups = (row_end - row_begin) / NR;
          float* yt = y + (t0 + t1) * ldy + n;
          WithCount<4>(static_cast<int>(m), [&](auto mr) {
            constexpr int MR = decltype(mr)::value;
            if (t0 + t1 == 0)
              Mxfp4SplitTiles<MR, NR, true>(xs + t1 * K, N, codes, scale, n, groups, yt, ldy);
            else
              Mxfp4SplitTiles<MR, NR, false>(xs + t1 * K, N, codes, scale, n, groups, yt, ldy);
          });
          n += groups * NR;
        }
      }
      for (; n < row_end; n += NR) {
        const int nr = static_cast<int>(std::min<int64_t>(NR, row_end - n));
        ForEachEqualPart(m, tiles, [&](int64_t t, int64_t mr) {
          TileAny<NR, MRmax>(tile, t1 + t, n, static_cast<int>(mr), nr);
        });
      }
    };
    using Four = std::integral_constant<int, 4>;
    if (largest <= 4) {
      rows(Four(), Four());
    } else if (largest == 5) {
      rows(Four(), std::integral_constant<int, 5>());
    } else {
      rows(std::integral_constant<int, kNRs>(), std::integral_constant<int, kMRs>());
    }
  });
}

// From this many tokens on, decoding a group of rows once into an L1 buffer for all the tokens
// (DotBf16Tile over it) beats Mxfp4SplitTile's decode in registers once per tile. One thread,
// one expert in L2, GFLOP/s with the register decode against the decoded rows (the best of 7
// runs of 400 products, two alternated runs; this core's vdpbf16ps peak is ~410):
//   [512, 512]:  9 tokens 285 / 244, 10 tokens 206-273 / 244, 11 tokens 224-245 / 255,
//                12 tokens 252-260 / 266, 16 tokens 230-234 / 279;
//   [512, 1024]: 9 tokens 291-303 / 269, 10 tokens 293-296 / 276, 11 tokens 281-282 / 261,
//                12 tokens 281-290 / 294, 16 tokens 271-275 / 310.
constexpr int64_t kMxfp4DecodeOnceMinTokens = 11;

// Rows [row_begin, row_end) of y = x W^T for bf16 tokens and MXFP4 weights (see above).
// Tokens in blocks of at most 256 KiB of split values (L2-resident). Per block, fewer than
// kMxfp4DecodeOnceMinTokens tokens run Mxfp4SplitTile; more decode each group of kNR rows once
// and apply it to every register tile of the block's tokens.
template <class Codes>
ATTNRES_BF16_DOT void Mxfp4DotRows(const uint16_t* x, int64_t T, int64_t N, const Codes& codes,
                                   const uint8_t* scale, int64_t row_begin, int64_t row_end,
                                   float* y, int64_t ldy) {
  const int64_t K = codes.K;
  thread_local std::vector<uint16_t> xs_buf, wd_buf;  // grown once per thread, never shrunk
  const int64_t tb = std::max<int64_t>(kMR, (256 << 10) / (K * 2) / kMR * kMR);
  const int64_t tb_used = std::min(T, tb);
  if (xs_buf.size() < static_cast<size_t>(tb_used * K)) xs_buf.resize(tb_used * K);
  if (wd_buf.size() < static_cast<size_t>(kNR * K)) wd_buf.resize(kNR * K);
  uint16_t* xs = xs_buf.data();
  uint16_t* wd = wd_buf.data();
  const ScaledBf16Tables& tables = ScaledTables();
  const PairIndex ix = MakePairIndex();
  for (int64_t t0 = 0; t0 < T; t0 += tb) {
    const int64_t tn = std::min(tb, T - t0);
    SplitTokens(x + t0 * K, tn, K, ix, xs);
    if (tn < kMxfp4DecodeOnceMinTokens) {
      Mxfp4SplitRows(xs, tn, t0, N, codes, scale, row_begin, row_end, y, ldy);
      continue;
    }
    for (int64_t n = row_begin; n < row_end; n += kNR) {
      const int nr = static_cast<int>(std::min<int64_t>(kNR, row_end - n));
      DecodeRowsBf16(codes, scale, N, n, nr, tables, ix, wd);
      // The decoded rows are a [nr, K] matrix whose row i is weight row n + i.
      const auto tile = [&](auto mr, auto nrc, int64_t t, int64_t i, int64_t /*rs = 1*/) {
        DotBf16Tile<decltype(mr)::value, decltype(nrc)::value>(xs + t * K, K, wd, nr, i, 1,
                                                               y + (t0 + t) * ldy + n + i, ldy);
      };
      // ceil(tn / kMR) tiles of near-equal size (9 tokens as 3 + 3 + 3, not 4 + 4 + 1: a
      // one-token tile costs a full tile's weight loads for a quarter of its work).
      ForEachEqualPart(tn, (tn + kMR - 1) / kMR, [&](int64_t t, int64_t mr) {
        TileAny<kNR, kMR>(tile, t, 0, static_cast<int>(mr), nr);
      });
    }
  }
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

void Mxfp4Matmul(const float* x, int64_t T, const uint8_t* packed, const uint8_t* scale, int64_t N,
                 int64_t K, float* y) {
  // MXFP4: consecutive tiles (P = 1, rs = 1). Page-strided tiles over the packed values (256 B
  // rows at K = 512: P = 16) were slower for a decode MoE batch of 8 cold k3-mini experts
  // (0.45-0.65 of a read pass against 0.48-0.76; that kernel is bound by its decode work).
  const Mxfp4Codes<false> codes{packed, K};
  Drive<kMRq, kNRq>(T, N, K, K / 2 + K / kMxfp4BlockSize, 1,
                    [&](auto mr, auto nr, int64_t t, int64_t n, int64_t /*rs = 1*/) {
                      Mxfp4Tile<decltype(mr)::value, decltype(nr)::value>(
                          x + t * K, N, K, codes, scale, n, y + t * N + n, N);
                    });
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

// The PageStride a job's rows are walked with: 1 for MXFP4 (see Mxfp4Matmul), for vdpbf16ps
// work (see WithDotBf16Tiles) and for lane-packed weights (a group is one sequential stream).
int64_t JobPageStride(const MatmulJob& j) {
  return is_mxfp4(j.kind) || j.kind == WeightKind::kBF16Lanes || JobDotBf16(j)
             ? 1
             : PageStride(j.T, job_row_bytes(j));
}

// Rows per work unit of a batch: one row group, page-strided runs kept whole.
int64_t JobGroupRows(const MatmulJob& j) {
  switch (j.kind) {
    case WeightKind::kMxfp4:
      return kNRq;
    case WeightKind::kMxfp4Quads:  // whole quads: a 4-row tile reads one quad
      static_assert(kMxfp4QuadRows % kNRq == 0);
      return kMxfp4QuadRows;
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
    case WeightKind::kMxfp4:
    case WeightKind::kMxfp4Quads: {
      const auto run = [&](const auto& codes) {
#if HWY_TARGET == HWY_AVX3
        if (j.xh != nullptr && cpu_info().avx512bf16) {  // bf16 x: vdpbf16ps (Mxfp4DotRows)
          Mxfp4DotRows(reinterpret_cast<const uint16_t*>(j.xh), T, N, codes, j.scale, row_begin,
                       row_end, y, ldy);
          return;
        }
#endif
        DriveRange<kMRq, kNRq>(T, K, row_bytes, P, row_begin, row_end,
                               [&](auto mr, auto nr, int64_t t, int64_t n, int64_t /*rs = 1*/) {
                                 Mxfp4Tile<decltype(mr)::value, decltype(nr)::value>(
                                     j.x + t * K, N, K, codes, j.scale, n, y + t * ldy + n, ldy);
                               });
      };
      const auto* packed = static_cast<const uint8_t*>(j.w);
      if (j.kind == WeightKind::kMxfp4Quads) {
        run(Mxfp4Codes<true>{packed, K});
      } else {
        run(Mxfp4Codes<false>{packed, K});
      }
      break;
    }
    case WeightKind::kBF16Lanes: {
      matmul_lanes_rows(j.xh, j.x, T, static_cast<const bf16*>(j.w), N, K, row_begin,
                        row_end - row_begin, y + row_begin, ldy);
      break;
    }
  }
}

// ComputeJobRows, then the rows' outputs rounded to bf16 when the job asks (while they are hot).
void RunJobRows(const MatmulJob& j, int64_t row_begin, int64_t row_end) {
  ComputeJobRows(j, row_begin, row_end);
  if (j.round_bf16) RoundOutputs(j.y, j.ldy > 0 ? j.ldy : j.N, j.T, row_begin, row_end);
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
HWY_EXPORT(Mxfp4Matmul);
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
  if (T <= 0 || N <= 0) return;
  HWY_DYNAMIC_DISPATCH(Mxfp4Matmul)(x, T, packed, scale, N, K, y);
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

int64_t job_row_bytes(const MatmulJob& j) {
  switch (j.kind) {
    case WeightKind::kF32:
      return j.K * 4;
    case WeightKind::kBF16:
    case WeightKind::kBF16Lanes:
      return j.K * 2;
    case WeightKind::kMxfp4:
    case WeightKind::kMxfp4Quads:
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
                    int64_t N, int64_t K, float* y, Layout codes) {
  assert(K % kMxfp4BlockSize == 0);
  assert(codes == Layout::kRowMajor || (codes == Layout::kMxfp4Quads && mxfp4_quads_fit(N, K)));
  MatmulJob j =
      plain_job(x, T, codes == Layout::kMxfp4Quads ? WeightKind::kMxfp4Quads : WeightKind::kMxfp4,
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
            case WeightKind::kMxfp4Quads:
              w = mxfp4_quads_get(static_cast<const uint8_t*>(j.w), j.scale, n, k, K);
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
