// Lane-packed BF16 projections (matmul_lanes.h) with Highway runtime dispatch.
//
// AVX3 with AVX512_BF16 and bf16 tokens: register tiles of MR tokens (1-6) x one group of 16 V
// rows (V = 4 but in a short last group), V x MR accumulators kept over the whole K. Per pair of
// columns a tile loads the group's V weight vectors (64 V contiguous bytes) and broadcasts each
// token's pair once, then issues V x MR vdpbf16ps. Other targets, and f32 tokens, run the same
// per-lane order in f32: a fused multiply-add of a pair's odd element, then of the even one.
// Where a call asks (matmul_lanes_rows' round_bf16), every tile rounds its outputs to bf16 as it
// stores them.
//
// Blocking: a thread takes a contiguous range of groups; tokens are walked in blocks of about
// 512 KiB of bf16 rows (L2), each block applied to every group of the range before the next, so
// a group's 64 x K weights (128 KiB at K = 1024) are read from memory once per token block and
// the tiles after the first find them in L2.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul_lanes_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>

#include "kernels/bf16_hwy-inl.h"
#include "kernels/count_hwy-inl.h"
#include "kernels/matmul_lanes.h"
#include "util/cpu.h"
#include "util/parallel.h"

#if HWY_TARGET == HWY_AVX3
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kGroup = kLaneGroupRows;
constexpr int kMaxTileTokens = 6;
// Tokens of a generic tile: with 16 vector registers, 4 tokens x 2 vectors of rows
// (GenericVectors), whose 2 weight loads and 8 broadcasts per pair feed 16 FMAs.
constexpr int kGenericTileTokens = HWY_MAX_BYTES >= 64 ? kMaxTileTokens : 4;

// Lanes [lo, hi) of a group (0 <= lo < hi <= its rows) are the rows a call writes; `round`: each
// is rounded to bf16 (round_bf16, kept in f32) as it is stored.
struct LaneSpan {
  int64_t lo, hi;
  bool round;
};

// The tokens of a call: bf16 (xh) or f32 (xf) rows of K values.
struct Tokens {
  const uint16_t* xh;
  const float* xf;
  int64_t K;
};
// Token t's value k as f32, for the generic tiles.
struct Bf16Tokens {
  const uint16_t* x;
  int64_t K;
  float at(int64_t t, int64_t k) const { return bf16_to_f32(bf16{x[t * K + k]}); }
};
struct F32Tokens {
  const float* x;
  int64_t K;
  float at(int64_t t, int64_t k) const { return x[t * K + k]; }
};

// Widened halves of a vector of packed pairs (u32 lane = even element in the low 16 bits).
template <class DF, class VU>
HWY_INLINE void WidenPairs(DF df, VU pairs, hn::Vec<DF>& even, hn::Vec<DF>& odd) {
  const hn::RebindToUnsigned<DF> du;
  even = hn::BitCast(df, hn::ShiftLeft<16>(pairs));
  odd = hn::BitCast(df, hn::And(pairs, hn::Set(du, 0xFFFF0000u)));
}

// Generic targets and f32 tokens: MR tokens (from t) x NV vectors of rows (lanes v0 ..
// v0 + NV L of a group of R rows), each lane a fused multiply-add of the odd then the even
// element of every pair (MulAdd; for bf16 tokens the product is exact, so this is vdpbf16ps's
// arithmetic on every target; for f32 tokens the twin's bits on targets with FMA).
template <int MR, int NV, class X>
HWY_INLINE void GenericTile(const X& x, int64_t t, const uint16_t* HWY_RESTRICT group, int64_t R,
                            int64_t v0, float* HWY_RESTRICT y, int64_t ldy, LaneSpan span) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const int64_t L = static_cast<int64_t>(hn::Lanes(df)), K = x.K;
  hn::Vec<decltype(df)> acc[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) acc[m][v] = hn::Zero(df);
  for (int64_t q = 0; q < K / 2; ++q) {
    const uint16_t* wq = group + (q * R + v0) * 2;
    if constexpr (MR == 1) {  // one vector's halves at a time: NV chains in few registers
      const auto xo = hn::Set(df, x.at(t, 2 * q + 1)), xe = hn::Set(df, x.at(t, 2 * q));
      for (int v = 0; v < NV; ++v) {
        hn::Vec<decltype(df)> even, odd;
        WidenPairs(df, hn::LoadU(du, reinterpret_cast<const uint32_t*>(wq + v * L * 2)), even, odd);
        acc[0][v] = hn::MulAdd(xo, odd, acc[0][v]);
        acc[0][v] = hn::MulAdd(xe, even, acc[0][v]);
      }
    } else {  // every vector's halves first, then each token's broadcasts once
      hn::Vec<decltype(df)> even[NV], odd[NV];
      for (int v = 0; v < NV; ++v)
        WidenPairs(df, hn::LoadU(du, reinterpret_cast<const uint32_t*>(wq + v * L * 2)), even[v],
                   odd[v]);
      for (int m = 0; m < MR; ++m) {
        const auto xo = hn::Set(df, x.at(t + m, 2 * q + 1)), xe = hn::Set(df, x.at(t + m, 2 * q));
        for (int v = 0; v < NV; ++v) {
          acc[m][v] = hn::MulAdd(xo, odd[v], acc[m][v]);
          acc[m][v] = hn::MulAdd(xe, even[v], acc[m][v]);
        }
      }
    }
  }
  HWY_ALIGN float out[hn::MaxLanes(df)];
  for (int v = 0; v < NV; ++v) {
    const int64_t first = v0 + v * L;
    const int64_t lo = std::max(first, span.lo), hi = std::min(first + L, span.hi);
    for (int m = 0; m < MR; ++m) {
      hn::Store(span.round ? CastT<bf16>(df, acc[m][v]) : acc[m][v], df, out);
      for (int64_t j = lo; j < hi; ++j) y[m * ldy + j] = out[j - first];
    }
  }
}

// Vectors of rows a generic tile of MR tokens covers at once, at most a group's 64 rows and at
// most 8. Each vector is MR independent chains; a one-token tile (decode) needs many of them to
// keep the FMA units busy, and holds one vector's halves at a time. Larger tiles hold the MR x NV
// accumulators, the NV vectors' widened halves and one token's two broadcasts in registers.
template <int MR>
constexpr int GenericVectors() {
  constexpr int regs = HWY_MAX_BYTES >= 64 ? 32 : 16;
  constexpr int per_group = static_cast<int>(kGroup / hn::MaxLanes(hn::ScalableTag<float>()));
  constexpr int fit = MR == 1 ? regs - 6 : (regs - 2) / (MR + 2);
  return std::max(1, std::min({fit, per_group, 8}));
}

template <int MR, class X>
HWY_NOINLINE void GenericGroupTile(const X& x, int64_t t, const uint16_t* group, int64_t R,
                                   float* y, int64_t ldy, LaneSpan span) {
  constexpr int kNV = GenericVectors<MR>();
  const int64_t L = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  for (int64_t v0 = span.lo / L * L; v0 < span.hi; v0 += kNV * L) {
    // R is a multiple of 16 and so of L: the vectors up to the span's end lie inside the group.
    const int64_t nv = std::min<int64_t>(kNV, (span.hi - v0 + L - 1) / L);
    WithCount<kNV>(nv, [&](auto tag) {
      GenericTile<MR, decltype(tag)::value>(x, t, group, R, v0, y, ldy, span);
    });
  }
}

#if HWY_TARGET == HWY_AVX3
#define ATTNRES_BF16_DOT __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

// MR bf16 tokens x a group of 16 V rows: V vectors of accumulators per token. A group is one
// sequential stream, so no software prefetch: the hardware prefetcher follows it, and at decode
// (MR = 1) a prefetch per line 2 KiB ahead made the k3-mini decode step slower where memory is
// fast (docs/performance.md, "Decode without software prefetch").
template <int MR, int V>
ATTNRES_BF16_DOT HWY_NOINLINE void DotLanesTile(const uint16_t* HWY_RESTRICT x, int64_t K,
                                                const uint16_t* HWY_RESTRICT group,
                                                float* HWY_RESTRICT y, int64_t ldy, LaneSpan span) {
  __m512 acc[MR][V];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < V; ++v) acc[m][v] = _mm512_setzero_ps();
  for (int64_t q = 0; q < K / 2; ++q) {
    const uint16_t* wq = group + q * V * 32;
    __m512bh w[V];
    for (int v = 0; v < V; ++v) w[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(wq + 32 * v));
    for (int m = 0; m < MR; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * K + 2 * q, sizeof(pair));
      const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      for (int v = 0; v < V; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], b, w[v]);
    }
  }
  for (int v = 0; v < V; ++v) {
    const int64_t lo = std::max<int64_t>(span.lo, 16 * v),
                  hi = std::min<int64_t>(span.hi, 16 * v + 16);
    if (lo >= hi) continue;
    const __mmask16 keep =
        static_cast<__mmask16>(((1u << (hi - 16 * v)) - 1) & ~((1u << (lo - 16 * v)) - 1));
    for (int m = 0; m < MR; ++m)
      _mm512_mask_storeu_ps(y + m * ldy + 16 * v, keep,
                            span.round ? CastT<bf16>(DF(), VF{acc[m][v]}).raw : acc[m][v]);
  }
}
#undef ATTNRES_BF16_DOT
#endif  // HWY_TARGET == HWY_AVX3

// One tile of mr tokens (from t) over one group of R rows: y points at the group's row 0 of
// token t.
HWY_INLINE void GroupTile(int64_t mr, const Tokens& x, int64_t t, const uint16_t* group, int64_t R,
                          float* y, int64_t ldy, LaneSpan span, bool dot) {
  WithCount<kMaxTileTokens>(mr, [&](auto tag) {
    constexpr int MR = decltype(tag)::value;
#if HWY_TARGET == HWY_AVX3
    if (dot) {
      WithCount<4>(R / kLaneRowQuantum, [&](auto vtag) {
        DotLanesTile<MR, decltype(vtag)::value>(x.xh + t * x.K, x.K, group, y, ldy, span);
      });
      return;
    }
#endif
    (void)dot;
    if (x.xh != nullptr) {
      GenericGroupTile<MR>(Bf16Tokens{x.xh, x.K}, t, group, R, y, ldy, span);
    } else {
      GenericGroupTile<MR>(F32Tokens{x.xf, x.K}, t, group, R, y, ldy, span);
    }
  });
}

// Groups [g_begin, g_end) of the packed matrix, limited to rows [row0, row0 + rows); y is the
// output of row row0, rounded to bf16 as it is stored when `round`. vdpbf16ps when the tokens
// are bf16 and the CPU has it.
void LanesGroups(const uint16_t* xh, const float* xf, int64_t T, const uint16_t* packed, int64_t N,
                 int64_t K, int64_t row0, int64_t rows, int64_t g_begin, int64_t g_end, float* y,
                 int64_t ldy, bool round) {
  bool dot = false;
#if HWY_TARGET == HWY_AVX3
  dot = xh != nullptr && cpu_info().avx512bf16;
#endif
  const Tokens x{xh, xf, K};
  int64_t tb = std::max<int64_t>(kMaxTileTokens, (512 << 10) / std::max<int64_t>(K * 2, 1));
  tb = tb / kMaxTileTokens * kMaxTileTokens;
  for (int64_t t0 = 0; t0 < T; t0 += tb) {
    const int64_t tn = std::min(tb, T - t0);
    for (int64_t g = g_begin; g < g_end; ++g) {
      const int64_t first = g * kGroup;  // the group's row 0
      const LaneSpan span{std::max<int64_t>(row0 - first, 0),
                          std::min<int64_t>(row0 + rows - first, kGroup), round};
      const uint16_t* group = packed + first * K;
      const int64_t R = lanes_group_rows(N, g);
      ForEachTokenTile(tn, dot ? kMaxTileTokens : kGenericTileTokens, [&](int64_t t, int64_t mr) {
        GroupTile(mr, x, t0 + t, group, R, y + (t0 + t) * ldy + (first - row0), ldy, span, dot);
      });
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(LanesGroups);

namespace {

// The groups over rows [row0, row0 + rows), split over the threads when the product is large
// enough (2^18 multiply-adds or 128 KiB of weights, like the other projections).
void lanes_call(const bf16* xh, const float* xf, int64_t T, const bf16* packed, int64_t N,
                int64_t K, int64_t row0, int64_t rows, float* y, int64_t ldy, bool may_split,
                bool round) {
  assert(K % 2 == 0 && row0 >= 0 && rows >= 0 && row0 + rows <= N);
  if (T <= 0 || rows <= 0) return;
  const int64_t g_first = row0 / kLaneGroupRows;
  const int64_t g_end = (row0 + rows + kLaneGroupRows - 1) / kLaneGroupRows;
  const bool parallel =
      may_split && (T * rows * K >= (int64_t{1} << 18) || rows * K * 2 >= (128 << 10));
  const auto* xu = reinterpret_cast<const uint16_t*>(xh);
  const auto* pu = reinterpret_cast<const uint16_t*>(packed);
  parallel_ranges(g_end - g_first, parallel, [&](int64_t b, int64_t e) {
    HWY_DYNAMIC_DISPATCH(LanesGroups)
    (xu, xf, T, pu, N, K, row0, rows, g_first + b, g_first + e, y, ldy, round);
  });
}

}  // namespace

void matmul_bf16_lanes(const bf16* x, int64_t T, const bf16* packed, int64_t N, int64_t K,
                       int64_t row0, int64_t rows, float* y, int64_t ldy) {
  lanes_call(x, nullptr, T, packed, N, K, row0, rows, y, ldy, true, false);
}

void matmul_lanes(const float* x, int64_t T, const bf16* packed, int64_t N, int64_t K, int64_t row0,
                  int64_t rows, float* y, int64_t ldy) {
  lanes_call(nullptr, x, T, packed, N, K, row0, rows, y, ldy, true, false);
}

void matmul_lanes_rows(const bf16* xh, const float* x, int64_t T, const bf16* packed, int64_t N,
                       int64_t K, int64_t row0, int64_t rows, float* y, int64_t ldy,
                       bool round_bf16) {
  assert(row0 % kLaneGroupRows == 0);
  lanes_call(xh, xh != nullptr ? nullptr : x, T, packed, N, K, row0, rows, y, ldy, false,
             round_bf16);
}

}  // namespace attnres
#endif  // HWY_ONCE
