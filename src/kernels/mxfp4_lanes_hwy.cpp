// MXFP4 projections over the 16-row lane layout (mxfp4_lanes.h) with Highway runtime dispatch.
//
// AVX3 with AVX512_BF16 and bf16 tokens: register tiles of MR tokens (1-4) x NV groups of 16
// rows. A group's codes of four pairs are one 64-byte load (the quad of util/mxfp4_lanes.h): per
// pair one vpermw of the words' low five bits from a fixed 32-word table (the 16 E2M1 values
// twice, so that bit 4, the next nibble's, does not matter) gives the group's 32 unscaled bf16
// weights, even elements in the low words and odd in the high. Each next pair's codes come up by a
// 4-bit word shift, but in the one-token tile, which the vector units bound, pairs 2 and 3's
// come from loading the quad again one byte on (LoadQuadHighBytes). Each token's pair is a
// 32-bit broadcast from its row. A block's 16 pairs accumulate into MR x NV block sums from zero,
// which one FMA each then adds to the accumulators times the block's scales (the E8M0 bytes
// shifted into f32 exponents). No horizontal sum, no table per scale, no copy of the tokens. f32
// tokens on AVX3: tiles of 1-4 tokens x 6-2 groups in f32, the same order with fused
// multiply-adds, a pair's even and odd weights two vpermps from a 16-entry table. Other targets
// run the same order in f32 (generic tiles, which decode E2M1 arithmetically). Every tile rounds
// its outputs to bf16 as it stores them where the call asks (Mxfp4RowsOptions::round_bf16).
//
// Blocking: tokens in blocks of about 512 KiB of token rows (L2); per block, each token tile walks
// the call's groups front to back, and the first tile's reads are prefetched a tile of groups
// ahead into L2 as it goes (the groups lie one after another, so the next tile's codes are the
// next NV * 16 * K/2 bytes): without that prefetch a standalone loop over 256 cold experts ran no
// faster than the row-major kernels (docs/performance.md, "MXFP4 experts in a 16-row lane
// layout"), and prefetched into L1 instead, decode's expert batches streamed 0.7-0.75 as fast
// ("MXFP4 prefetch into L2").
//
// Row-major codes (Mxfp4LanesRowsRowMajor) are packed into the lane layout 128 rows at a time by
// 16 x 16 byte transposes and a nibble shuffle into a buffer of the calling thread, then run
// through the same tiles.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/mxfp4_lanes_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/bf16_hwy-inl.h"
#include "kernels/count_hwy-inl.h"
#include "kernels/mxfp4_lanes.h"
#include "util/cpu.h"

#if HWY_TARGET == HWY_AVX3
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kRows = kMxfp4LaneRows;
constexpr int64_t kBlockPairs = kMxfp4BlockSize / 2;
constexpr int64_t kQuadPairs = 4;  // the pairs of a quad (util/mxfp4_lanes.h)
constexpr int64_t kBlockQuads = kBlockPairs / kQuadPairs;
constexpr int kMaxDotTokens = 4;
constexpr int kMaxF32Tokens = 4;  // AVX3 tiles of f32 tokens (F32Tile)
constexpr int kMaxGenericTokens = 2;

// The tokens of a call: bf16 (xh) or f32 (xf) rows of K values.
struct Tokens {
  const uint16_t* xh;
  const float* xf;
  int64_t K;
  float at(int64_t t, int64_t k) const {
    return xh != nullptr ? bf16_to_f32(bf16{xh[t * K + k]}) : xf[t * K + k];
  }
};

// A quad's 64 bytes as its 16 rows' 32-bit lanes (little-endian words; loads of vectors and of
// the scalar target's lanes copy bytes, so the bytes' alignment does not matter).
HWY_INLINE const uint32_t* QuadLanes(const uint8_t* quad) {
  return reinterpret_cast<const uint32_t*>(quad);
}

// The E2M1 values of codes c (u32 lanes, 0..15) as f32 bits: magnitudes 2..7 are normal numbers
// (exponent (m >> 1) - 1, one mantissa bit m & 1), 1 is 0.5, 0 is 0; bit 3 is the sign.
template <class DU, class VU = hn::Vec<DU>>
HWY_INLINE VU E2m1Bits(DU du, VU c) {
  const VU m = hn::And(c, hn::Set(du, 7u));
  const VU normal = hn::Or(hn::ShiftLeft<23>(hn::Add(hn::ShiftRight<1>(m), hn::Set(du, 126u))),
                           hn::ShiftLeft<22>(hn::And(m, hn::Set(du, 1u))));
  const VU small = hn::IfThenElseZero(hn::Eq(m, hn::Set(du, 1u)), hn::Set(du, 0x3f000000u));
  const VU magnitude = hn::IfThenElse(hn::Lt(m, hn::Set(du, 2u)), small, normal);
  return hn::Or(magnitude, hn::ShiftLeft<28>(hn::And(c, hn::Set(du, 8u))));
}

// E8M0 bytes e (u32 lanes) as the f32 bits of 2^(e - 127): e shifted into the exponent field,
// but for e = 0 (2^-127, a subnormal) and e = 255 (NaN).
template <class DU, class VU = hn::Vec<DU>>
HWY_INLINE VU E8m0Bits(DU du, VU e) {
  VU bits = hn::ShiftLeft<23>(e);
  bits = hn::IfThenElse(hn::Eq(e, hn::Zero(du)), hn::Set(du, 0x00400000u), bits);
  return hn::IfThenElse(hn::Eq(e, hn::Set(du, 255u)), hn::Set(du, 0x7fc00000u), bits);
}

// Generic targets and f32 tokens: MR tokens (from t) x one group, the group's 16 rows as
// 16 / L vectors. A quad's codes are 32-bit lanes, one per row; per pair the low nibbles of the
// lane's two words (even, odd) are decoded to f32 (E2m1Bits), then every token's two broadcasts
// feed MulAdd (for bf16 tokens the product is exact, so this is the twin's arithmetic on every
// target; for f32 tokens on targets with FMA).
template <int MR>
HWY_NOINLINE void GenericTile(const Tokens& x, int64_t t, const uint8_t* HWY_RESTRICT codes,
                              const uint8_t* HWY_RESTRICT scales, float* HWY_RESTRICT y,
                              int64_t ldy, bool round) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint8_t, decltype(du)> d8;
  using V = hn::Vec<decltype(df)>;
  using VU = hn::Vec<decltype(du)>;
  // x86 vectors have a fixed width: Lanes(df) == MaxLanes(df), at most 16 floats.
  constexpr int64_t kMaxV = kRows / static_cast<int64_t>(hn::MaxLanes(df));
  const int64_t L = static_cast<int64_t>(hn::Lanes(df)), NV = kRows / L, K = x.K;
  HWY_DASSERT(NV <= kMaxV);
  V acc[MR][kMaxV], s[MR][kMaxV];
  for (int m = 0; m < MR; ++m)
    for (int64_t v = 0; v < NV; ++v) acc[m][v] = hn::Zero(df);
  for (int64_t b = 0; b < K / kMxfp4BlockSize; ++b) {
    for (int m = 0; m < MR; ++m)
      for (int64_t v = 0; v < NV; ++v) s[m][v] = hn::Zero(df);
    for (int64_t u = b * kBlockQuads; u < (b + 1) * kBlockQuads; ++u) {
      VU lane[kMaxV];  // pair q's codes in the words' low nibbles (E2m1Bits reads bits 0-3)
      for (int64_t v = 0; v < NV; ++v)
        lane[v] = hn::LoadU(du, QuadLanes(codes + u * kMxfp4QuadBytes) + v * L);
      for (int64_t p = 0; p < kQuadPairs; ++p) {
        const int64_t q = u * kQuadPairs + p;
        V odd[kMaxV], even[kMaxV];
        for (int64_t v = 0; v < NV; ++v) {
          even[v] = hn::BitCast(df, E2m1Bits(du, lane[v]));
          odd[v] = hn::BitCast(df, E2m1Bits(du, hn::ShiftRight<16>(lane[v])));
          lane[v] = hn::ShiftRight<4>(lane[v]);
        }
        for (int m = 0; m < MR; ++m) {
          const V xo = hn::Set(df, x.at(t + m, 2 * q + 1)), xe = hn::Set(df, x.at(t + m, 2 * q));
          for (int64_t v = 0; v < NV; ++v) {
            s[m][v] = hn::MulAdd(xo, odd[v], s[m][v]);
            s[m][v] = hn::MulAdd(xe, even[v], s[m][v]);
          }
        }
      }
    }
    for (int64_t v = 0; v < NV; ++v) {
      const V scale = hn::BitCast(
          df, E8m0Bits(du, hn::PromoteTo(du, hn::LoadU(d8, scales + b * kRows + v * L))));
      for (int m = 0; m < MR; ++m) acc[m][v] = hn::MulAdd(s[m][v], scale, acc[m][v]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int64_t v = 0; v < NV; ++v)
      hn::StoreU(round ? CastT<bf16>(df, acc[m][v]) : acc[m][v], df, y + m * ldy + v * L);
}

#if HWY_TARGET == HWY_AVX3
// The group's 16 rows' scales of one block as f32 factors (E8m0Bits). kNormal: no byte is 0 or
// 255 (mxfp4_scales_normal), so each factor is the byte shifted into the f32 exponent field: two
// instructions instead of six, of about 50 a group's block costs a one-token tile.
template <bool kNormal>
HWY_INLINE __m512 BlockScales(const uint8_t* HWY_RESTRICT p) {
  const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  if constexpr (kNormal) return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  return hn::BitCast(df, E8m0Bits(du, hn::VFromD<decltype(du)>{e})).raw;
}

// The pieces DotTile and F32Tile share. A tile covers NV groups (the first group's codes and
// scales; groups group_codes and group_scales bytes apart) and MR tokens.

// The first tile over these groups, which streams them from memory, prefetches the next NV
// groups' codes as it goes: NV * quads * 64 bytes over the quads, NV lines a quad. Into L2
// (prefetcht1), not L1: a prefetch into L1 holds one of the core's few L1 miss buffers until
// its line arrives from memory, and with the tile's own loads in the same buffers the core then
// keeps too few lines in flight to stream at the memory's rate. The last tile's prefetches run
// past the groups into whatever the loader put next (a matrix's scales, the expert's next
// matrix); prefetches do not fault, and the address is an integer, so no pointer leaves the
// matrix.
template <int NV>
HWY_INLINE void PrefetchNextGroups(uintptr_t next, int64_t u) {
  const uintptr_t at = next + static_cast<uintptr_t>(u * NV * kMxfp4QuadBytes);
  for (int v = 0; v < NV; ++v)
    _mm_prefetch(reinterpret_cast<const char*>(at + static_cast<uintptr_t>(v * kMxfp4QuadBytes)),
                 _MM_HINT_T1);
}

// Quad u's codes of each group: 32-bit lanes, one per row (util/mxfp4_lanes.h).
template <int NV>
HWY_INLINE void LoadQuadCodes(const uint8_t* codes, int64_t group_codes, int64_t u,
                              __m512i (&d)[NV]) {
  for (int v = 0; v < NV; ++v)
    d[v] = _mm512_loadu_si512(codes + v * group_codes + u * kMxfp4QuadBytes);
}

// Quad u's codes of each group loaded one byte on, so that each 16-bit word holds the high byte
// of the quad's word, with the codes of its pairs 2 and 3 (bits 8-15), in its low byte: a second
// load from L1 in place of an 8-bit shift on the vector units. The byte after the quad is masked
// out (the word's high byte, which no table index reads), so the load never reaches past the
// codes. Only the one-token tile takes it: its vector units bound it (the expert batches of a
// decode step streamed 0.7-3.1% faster for both this and BlockScales<true>), while tiles of 2-4
// tokens ran their prefill expert batches 0.98-1.00 as fast with it and 1.05-1.10 without
// (docs/performance.md, "Fewer instructions in the one-token MXFP4 tile").
template <int NV>
HWY_INLINE void LoadQuadHighBytes(const uint8_t* codes, int64_t group_codes, int64_t u,
                                  __m512i (&d)[NV]) {
  constexpr __mmask64 kQuadBytesAfterFirst = ~__mmask64{0} >> 1;
  for (int v = 0; v < NV; ++v)
    d[v] = _mm512_maskz_loadu_epi8(kQuadBytesAfterFirst,
                                   codes + v * group_codes + u * kMxfp4QuadBytes + 1);
}

// acc += s times block b's scales, then s = 0 for the next block.
template <int MR, int NV, bool kNormalScales>
HWY_INLINE void AddBlockSums(const uint8_t* scales, int64_t group_scales, int64_t b,
                             __m512 (&s)[MR][NV], __m512 (&acc)[MR][NV]) {
  for (int v = 0; v < NV; ++v) {
    const __m512 sc = BlockScales<kNormalScales>(scales + v * group_scales + b * kRows);
    for (int m = 0; m < MR; ++m) {
      acc[m][v] = _mm512_fmadd_ps(s[m][v], sc, acc[m][v]);
      s[m][v] = _mm512_setzero_ps();
    }
  }
}

// The tile's outputs, each rounded to bf16 (round_bf16, kept in f32) when `round`.
template <int MR, int NV>
HWY_INLINE void StoreTile(const __m512 (&acc)[MR][NV], float* HWY_RESTRICT y, int64_t ldy,
                          bool round) {
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v)
      _mm512_storeu_ps(y + m * ldy + v * kRows,
                       round ? CastT<bf16>(DF(), VF{acc[m][v]}).raw : acc[m][v]);
}

template <int MR, int NV>
HWY_INLINE void ZeroTile(__m512 (&a)[MR][NV]) {
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) a[m][v] = _mm512_setzero_ps();
}

// Groups of 16 rows an f32 tile of MR tokens covers: MR x NV accumulators and block sums, the
// NV groups' even and odd weights, the table and two token broadcasts fit 32 registers.
template <int MR>
constexpr int F32Groups() {
  return MR == 1 ? 6 : MR == 2 ? 4 : MR == 3 ? 3 : 2;
}

// MR f32 tokens x NV groups, as GenericTile computes them (the twin's order with fused
// multiply-adds): a quad's 32-bit lanes index a 16-entry f32 table of the E2M1 values with their
// low four bits (vpermps reads no more), the pair's even element, and, shifted by 16, its odd
// one; a 4-bit shift brings up the next pair. Each token's two elements are broadcasts. The same
// next-tile prefetch as DotTile when kPrefetch, and the same scales.
template <int MR, int NV, bool kPrefetch, bool kNormalScales>
HWY_NOINLINE void F32Tile(const float* HWY_RESTRICT x, int64_t K, const uint8_t* HWY_RESTRICT codes,
                          const uint8_t* HWY_RESTRICT scales, float* HWY_RESTRICT y, int64_t ldy,
                          bool round) {
  const __m512 table = _mm512_loadu_ps(kE2m1Values);
  const int64_t pairs = K / 2, blocks = K / kMxfp4BlockSize;
  const int64_t group_codes = pairs * kRows, group_scales = blocks * kRows;
  const uintptr_t next =
      reinterpret_cast<uintptr_t>(codes) + static_cast<uintptr_t>(NV * group_codes);
  __m512 acc[MR][NV], s[MR][NV];
  ZeroTile(acc);
  ZeroTile(s);
  for (int64_t b = 0; b < blocks; ++b) {
    // Constant counts, which GCC unrolls: the block's 16 pairs in straight code, so that the
    // block sums stay in registers.
#pragma GCC unroll 4
    for (int64_t j = 0; j < kBlockQuads; ++j) {
      const int64_t u = b * kBlockQuads + j;
      if constexpr (kPrefetch) PrefetchNextGroups<NV>(next, u);
      __m512i d[NV];
      LoadQuadCodes(codes, group_codes, u, d);
#pragma GCC unroll 4
      for (int64_t p = 0; p < kQuadPairs; ++p) {
        const int64_t q = u * kQuadPairs + p;
        __m512 even[NV], odd[NV];
        for (int v = 0; v < NV; ++v) {
          even[v] = _mm512_permutexvar_ps(d[v], table);
          odd[v] = _mm512_permutexvar_ps(_mm512_srli_epi32(d[v], 16), table);
          d[v] = _mm512_srli_epi32(d[v], 4);
        }
        for (int m = 0; m < MR; ++m) {
          const __m512 xo = _mm512_set1_ps(x[m * K + 2 * q + 1]);
          const __m512 xe = _mm512_set1_ps(x[m * K + 2 * q]);
          for (int v = 0; v < NV; ++v)
            s[m][v] = _mm512_fmadd_ps(xe, even[v], _mm512_fmadd_ps(xo, odd[v], s[m][v]));
        }
      }
    }
    AddBlockSums<MR, NV, kNormalScales>(scales, group_scales, b, s, acc);
  }
  StoreTile(acc, y, ldy, round);
}

#define ATTNRES_BF16_DOT __attribute__((target(HWY_TARGET_STR ",avx512bf16")))

// Groups of 16 rows a tile of MR tokens covers: its MR x NV accumulators and MR x NV block sums,
// the NV groups' quads of codes and decoded weights, the table and a token's broadcast fit the 32
// vector registers (more tokens than 4 leave room for one group only).
template <int MR>
constexpr int DotGroups() {
  return MR == 1 ? 7 : MR == 2 ? 4 : MR == 3 ? 3 : 2;
}

// The 16 E2M1 values as bf16 (the high halves of E2m1Bits, exact), in words 0-15 and again in
// 16-31, so that vpermw's 5-bit index may carry any bit 4 (the next nibble's lowest bit).
ATTNRES_BF16_DOT HWY_INLINE __m512i Bf16E2m1Table() {
  const hn::ScalableTag<uint32_t> du;
  const __m256i words =
      _mm512_cvtepi32_epi16(hn::ShiftRight<16>(E2m1Bits(du, hn::Iota(du, 0u))).raw);
  return _mm512_inserti64x4(_mm512_castsi256_si512(words), words, 1);
}

// MR bf16 tokens x NV groups (codes and scales of the tile's first group; group_codes and
// group_scales bytes apart). kPrefetch: the first tile over these groups, which streams them
// from memory, prefetches the next NV groups' codes as it goes (PrefetchNextGroups).
// kNormalScales: no scale byte of the groups is 0 or 255 (BlockScales). round: outputs rounded
// to bf16 as they are stored (StoreTile).
template <int MR, int NV, bool kPrefetch, bool kNormalScales>
ATTNRES_BF16_DOT HWY_NOINLINE void DotTile(const uint16_t* HWY_RESTRICT x, int64_t K,
                                           const uint8_t* HWY_RESTRICT codes,
                                           const uint8_t* HWY_RESTRICT scales,
                                           float* HWY_RESTRICT y, int64_t ldy, bool round) {
  const __m512i table = Bf16E2m1Table();
  const int64_t pairs = K / 2, blocks = K / kMxfp4BlockSize;
  const int64_t group_codes = pairs * kRows, group_scales = blocks * kRows;
  const uintptr_t next =
      reinterpret_cast<uintptr_t>(codes) + static_cast<uintptr_t>(NV * group_codes);
  __m512 acc[MR][NV], s[MR][NV];
  ZeroTile(acc);
  ZeroTile(s);
  for (int64_t b = 0; b < blocks; ++b) {
    // Constant counts, which GCC unrolls: the block's 16 pairs in straight code, so that the
    // block sums stay in registers.
#pragma GCC unroll 4
    for (int64_t j = 0; j < kBlockQuads; ++j) {
      const int64_t u = b * kBlockQuads + j;
      if constexpr (kPrefetch) PrefetchNextGroups<NV>(next, u);
      __m512i d[NV];
#pragma GCC unroll 4
      for (int64_t p = 0; p < kQuadPairs; ++p) {
        const int64_t q = u * kQuadPairs + p;
        if (p == 0) LoadQuadCodes(codes, group_codes, u, d);
        if (MR == 1 && p == 2) LoadQuadHighBytes(codes, group_codes, u, d);
        __m512bh w[NV];
        for (int v = 0; v < NV; ++v) {
          w[v] = reinterpret_cast<__m512bh>(_mm512_permutexvar_epi16(d[v], table));
          if (MR > 1 || p % 2 == 0) d[v] = _mm512_srli_epi16(d[v], 4);
        }
        for (int m = 0; m < MR; ++m) {
          int32_t pair;
          std::memcpy(&pair, x + m * K + 2 * q, sizeof(pair));
          const __m512bh xb = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
          for (int v = 0; v < NV; ++v) s[m][v] = _mm512_dpbf16_ps(s[m][v], xb, w[v]);
        }
      }
    }
    AddBlockSums<MR, NV, kNormalScales>(scales, group_scales, b, s, acc);
  }
  StoreTile(acc, y, ldy, round);
}
#undef ATTNRES_BF16_DOT
#endif  // HWY_TARGET == HWY_AVX3

// Which tiles a call runs: DotTile (bf16 tokens on AVX512_BF16), F32Tile (f32 tokens on AVX3),
// GenericTile (the rest).
enum class TilePath { kDot, kF32, kGeneric };

// tile(NV tag, c, s, yt) over the groups [g0, g1) in runs of up to kNV: a run's first group's
// codes c and scales s, and its rows' outputs yt (y: group g0's).
template <int kNV, class Tile>
HWY_INLINE void ForEachGroupRun(int64_t K, const uint8_t* codes, const uint8_t* scales, int64_t g0,
                                int64_t g1, float* y, const Tile& tile) {
  const int64_t group_codes = K / 2 * kRows, group_scales = K / kMxfp4BlockSize * kRows;
  for (int64_t g = g0; g < g1; g += kNV)
    WithCount<kNV>(std::min<int64_t>(kNV, g1 - g), [&](auto tag) {
      tile(tag, codes + g * group_codes, scales + g * group_scales, y + (g - g0) * kRows);
    });
}

// fn(std::bool_constant<a>(), std::bool_constant<b>()) for runtime a and b.
template <class Fn>
HWY_INLINE void WithFlags(bool a, bool b, const Fn& fn) {
  const auto second = [&](auto ta) {
    if (b)
      fn(ta, std::true_type());
    else
      fn(ta, std::false_type());
  };
  if (a)
    second(std::true_type());
  else
    second(std::false_type());
}

// Rows [row0, row0 + rows) (whole groups) for the MR tokens from t; y is token t's output of
// row row0. `first`: this is the first token tile over the rows in this call; `normal`: no
// scale byte of the rows is 0 or 255 (mxfp4_scales_normal); `round`: outputs rounded to bf16 as
// they are stored.
template <int MR>
void TokenTile(const Tokens& x, int64_t t, const uint8_t* codes, const uint8_t* scales,
               int64_t row0, int64_t rows, float* y, int64_t ldy, TilePath path, bool first,
               bool normal, bool round) {
  const int64_t K = x.K, g0 = row0 / kRows, g1 = (row0 + rows) / kRows;
#if HWY_TARGET == HWY_AVX3
  if (path == TilePath::kDot) {
    ForEachGroupRun<DotGroups<MR>()>(
        K, codes, scales, g0, g1, y, [&](auto tag, const uint8_t* c, const uint8_t* s, float* yt) {
          WithFlags(first, normal, [&](auto prefetch, auto normal_scales) {
            DotTile<MR, decltype(tag)::value, prefetch(), normal_scales()>(x.xh + t * K, K, c, s,
                                                                           yt, ldy, round);
          });
        });
    return;
  }
  if constexpr (MR <= kMaxF32Tokens) {
    if (path == TilePath::kF32) {
      ForEachGroupRun<F32Groups<MR>()>(
          K, codes, scales, g0, g1, y,
          [&](auto tag, const uint8_t* c, const uint8_t* s, float* yt) {
            WithFlags(first, normal, [&](auto prefetch, auto normal_scales) {
              F32Tile<MR, decltype(tag)::value, prefetch(), normal_scales()>(x.xf + t * K, K, c, s,
                                                                             yt, ldy, round);
            });
          });
      return;
    }
  }
#endif
  (void)path;
  (void)first;
  (void)normal;
  ForEachGroupRun<1>(K, codes, scales, g0, g1, y,
                     [&](auto, const uint8_t* c, const uint8_t* s, float* yt) {
                       GenericTile<MR>(x, t, c, s, yt, ldy, round);
                     });
}

// `normal`: no scale byte of the rows is 0 or 255 (Mxfp4RowsOptions); only the AVX3 tiles read
// it. `round`: outputs rounded to bf16 as the tiles store them.
void Mxfp4LanesRows(const uint16_t* xh, const float* xf, int64_t T, const uint8_t* codes,
                    const uint8_t* scales, int64_t K, int64_t row0, int64_t rows, float* y,
                    int64_t ldy, bool normal, bool round) {
  TilePath path = TilePath::kGeneric;
#if HWY_TARGET == HWY_AVX3
  if (xh != nullptr && cpu_info().avx512bf16) path = TilePath::kDot;
  if (xh == nullptr) path = TilePath::kF32;
#endif
  const Tokens x{xh, xh != nullptr ? nullptr : xf, K};
  const int64_t most = path == TilePath::kDot   ? kMaxDotTokens
                       : path == TilePath::kF32 ? kMaxF32Tokens
                                                : kMaxGenericTokens;
  const int64_t row_bytes = K * (xh != nullptr ? 2 : 4);
  int64_t tb = std::max<int64_t>(most, (512 << 10) / std::max<int64_t>(row_bytes, 1));
  tb = tb / most * most;
  for (int64_t t0 = 0; t0 < T; t0 += tb) {
    const int64_t tn = std::min(tb, T - t0);
    ForEachTokenTile(tn, most, [&](int64_t t, int64_t mr) {
      WithCount<kMaxDotTokens>(mr, [&](auto tag) {
        TokenTile<decltype(tag)::value>(x, t0 + t, codes, scales, row0, rows, y + (t0 + t) * ldy,
                                        ldy, path, t == 0, normal, round);
      });
    });
  }
}

// The 16 x 16 bytes rows[r][c] (16 bytes from each of rows[0..15]; a null row reads as zeros)
// transposed: out + 16 c holds column c, rows 0-15 in order. Four rounds of interleaves, each
// pairing rows (then pairs, quads and octets of rows) at twice the width of the last.
HWY_INLINE void Transpose16x16(const uint8_t* const* rows, uint8_t* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_SCALAR  // one lane: no 16-byte vectors
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j) out[16 * j + i] = rows[i] != nullptr ? rows[i][j] : 0;
#else
  const hn::Full128<uint8_t> d8;
  const hn::Full128<uint16_t> d16;
  const hn::Full128<uint32_t> d32;
  const hn::Full128<uint64_t> d64;
  using V8 = hn::Vec<decltype(d8)>;
  V8 r[16], a[16], b[16], c[16];
  for (int i = 0; i < 16; ++i) r[i] = rows[i] != nullptr ? hn::LoadU(d8, rows[i]) : hn::Zero(d8);
  // a[2i + h]: columns 8h .. 8h + 7 of rows 2i, 2i + 1, a 16-bit word per column.
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = hn::InterleaveLower(d8, r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = hn::InterleaveUpper(d8, r[2 * i], r[2 * i + 1]);
  }
  // b[4i + k]: columns 4k .. 4k + 3 of rows 4i .. 4i + 3, a 32-bit word per column.
  for (int i = 0; i < 4; ++i)
    for (int h = 0; h < 2; ++h) {
      const auto x = hn::BitCast(d16, a[4 * i + h]), y = hn::BitCast(d16, a[4 * i + 2 + h]);
      b[4 * i + 2 * h] = hn::BitCast(d8, hn::InterleaveLower(d16, x, y));
      b[4 * i + 2 * h + 1] = hn::BitCast(d8, hn::InterleaveUpper(d16, x, y));
    }
  // c[8j + m]: columns 2m, 2m + 1 of rows 8j .. 8j + 7, a 64-bit word per column.
  for (int j = 0; j < 2; ++j)
    for (int k = 0; k < 4; ++k) {
      const auto x = hn::BitCast(d32, b[8 * j + k]), y = hn::BitCast(d32, b[8 * j + 4 + k]);
      c[8 * j + 2 * k] = hn::BitCast(d8, hn::InterleaveLower(d32, x, y));
      c[8 * j + 2 * k + 1] = hn::BitCast(d8, hn::InterleaveUpper(d32, x, y));
    }
  for (int m = 0; m < 8; ++m) {
    const auto x = hn::BitCast(d64, c[m]), y = hn::BitCast(d64, c[8 + m]);
    hn::StoreU(hn::BitCast(d8, hn::InterleaveLower(d64, x, y)), d8, out + 32 * m);
    hn::StoreU(hn::BitCast(d8, hn::InterleaveUpper(d64, x, y)), d8, out + 32 * m + 16);
  }
#endif
}

// Four pairs' codes of a group with the 16 rows' bytes of each pair side by side (pairs: 4 x 16
// bytes, low nibble = the even element) -> the quad of util/mxfp4_lanes.h (64 bytes): row r's
// 32-bit lane holds its even codes in the low word and its odd codes in the high word, pair s's
// at bits 4s.
HWY_INLINE void PairsToQuad(const uint8_t* HWY_RESTRICT pairs, uint8_t* HWY_RESTRICT quad) {
#if HWY_TARGET == HWY_SCALAR  // one lane: no 16-byte vectors
  for (int64_t r = 0; r < kRows; ++r) {
    uint32_t lane = 0;
    for (int s = 0; s < static_cast<int>(kQuadPairs); ++s) {
      const uint32_t b = pairs[s * kRows + r];
      lane |= (b & 0x0fu) << (4 * s) | (b >> 4) << (16 + 4 * s);
    }
    std::memcpy(quad + 4 * r, &lane, sizeof(lane));
  }
#else
  const hn::Full128<uint8_t> d8;
  const hn::Full128<uint16_t> d16;
  const auto low = hn::Set(d8, 0x0f), high = hn::Set(d8, 0xf0);
  // Row r's lane is the bytes even[0][r], even[1][r], odd[0][r], odd[1][r]: even[h] holds pairs
  // 2h and 2h + 1's even codes (low nibbles), odd[h] their odd codes, pair 2h's in bits 0-3.
  hn::Vec<decltype(d8)> even[2], odd[2];
  for (int h = 0; h < 2; ++h) {
    const auto a = hn::LoadU(d8, pairs + 2 * h * kRows);
    const auto b = hn::LoadU(d8, pairs + (2 * h + 1) * kRows);
    const auto b_up = hn::BitCast(d8, hn::ShiftLeft<4>(hn::BitCast(d16, b)));
    const auto a_down = hn::BitCast(d8, hn::ShiftRight<4>(hn::BitCast(d16, a)));
    even[h] = hn::Or(hn::And(a, low), hn::And(b_up, high));
    odd[h] = hn::Or(hn::And(a_down, low), hn::And(b, high));
  }
  const auto even_lo = hn::BitCast(d16, hn::InterleaveLower(d8, even[0], even[1]));  // rows 0-7
  const auto even_hi = hn::BitCast(d16, hn::InterleaveUpper(d8, even[0], even[1]));  // 8-15
  const auto odd_lo = hn::BitCast(d16, hn::InterleaveLower(d8, odd[0], odd[1]));
  const auto odd_hi = hn::BitCast(d16, hn::InterleaveUpper(d8, odd[0], odd[1]));
  hn::StoreU(hn::BitCast(d8, hn::InterleaveLower(d16, even_lo, odd_lo)), d8, quad);  // rows 0-3
  hn::StoreU(hn::BitCast(d8, hn::InterleaveUpper(d16, even_lo, odd_lo)), d8, quad + 16);
  hn::StoreU(hn::BitCast(d8, hn::InterleaveLower(d16, even_hi, odd_hi)), d8, quad + 32);
  hn::StoreU(hn::BitCast(d8, hn::InterleaveUpper(d16, even_hi, odd_hi)), d8, quad + 48);
#endif
}

// Rows [0, n) (n <= 16) of row-major codes [., K/2] and scales [., K/32] as one 16-row group of
// the lane layout (gc: 16 K/2 bytes, gs: 16 K/32): 16 x 16 transposes of a block's pairs, then
// rearranged into quads, and 16 x 16 transposes of 16 blocks' scales (one byte at a time for the
// blocks past a multiple of 16). The rows past n get zero codes and zero scale bytes: their
// block sums are +0, so their outputs are +0.
void PackGroup(const uint8_t* codes, const uint8_t* scales, int64_t K, int64_t n,
               uint8_t* HWY_RESTRICT gc, uint8_t* HWY_RESTRICT gs) {
  const int64_t pairs = K / 2, blocks = K / kMxfp4BlockSize;
  const uint8_t* rows[kRows];
  // 16 rows are 16 streams at once, more than hardware prefetchers follow: each row's lines are
  // fetched kAhead bytes before its transposes reach them (the first kAhead at the start).
  constexpr int64_t kAhead = 256;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < std::min(kAhead, pairs); o += 64)
      __builtin_prefetch(codes + r * pairs + o, /*rw=*/0, /*locality=*/2);
  alignas(64) uint8_t block[kBlockPairs * kRows];     // a block's pairs, 16 rows side by side
  for (int64_t q = 0; q < pairs; q += kBlockPairs) {  // a block's 16 pairs at a time
    if (q % 64 == 0 && q + kAhead < pairs)
      for (int64_t r = 0; r < n; ++r)
        __builtin_prefetch(codes + r * pairs + q + kAhead, /*rw=*/0, /*locality=*/2);
    for (int64_t r = 0; r < kRows; ++r) rows[r] = r < n ? codes + r * pairs + q : nullptr;
    Transpose16x16(rows, block);
    for (int64_t u = 0; u < kBlockQuads; ++u)
      PairsToQuad(block + u * kQuadPairs * kRows, gc + q * kRows + u * kMxfp4QuadBytes);
  }
  const int64_t whole = blocks / kRows * kRows;
  for (int64_t b = 0; b < whole; b += kRows) {
    for (int64_t r = 0; r < kRows; ++r) rows[r] = r < n ? scales + r * blocks + b : nullptr;
    Transpose16x16(rows, gs + b * kRows);
  }
  for (int64_t b = whole; b < blocks; ++b)
    for (int64_t r = 0; r < kRows; ++r) gs[b * kRows + r] = r < n ? scales[r * blocks + b] : 0;
}

// Rows [row0, row0 + rows) of row-major codes and scales: up to 128 rows at a time packed into
// the calling thread's buffer (PackGroup), then the same token tiles as Mxfp4LanesRows over
// them; a ragged last group's outputs go through a buffer of their own, of which only the rows
// that exist are copied out. A chunk's packed scales, just written and so in L1, are checked
// for bytes 0 and 255 there (a mapped matrix was never read whole at load, where the lane
// layout's are).
void Mxfp4LanesRowsRowMajor(const uint16_t* xh, const float* xf, int64_t T, const uint8_t* codes,
                            const uint8_t* scales, int64_t K, int64_t row0, int64_t rows, float* y,
                            int64_t ldy, bool round) {
  constexpr int64_t kChunkRows = 128;
  const int64_t pairs = K / 2, blocks = K / kMxfp4BlockSize, end = row0 + rows;
  thread_local std::vector<uint8_t> packed;
  thread_local std::vector<float> ragged;
  packed.resize(static_cast<size_t>(kChunkRows * (pairs + blocks)));
  uint8_t* pc = packed.data();
  uint8_t* ps = pc + kChunkRows * pairs;
  for (int64_t c0 = row0; c0 < end; c0 += kChunkRows) {
    const int64_t n = std::min(kChunkRows, end - c0);
    const int64_t whole = n / kRows * kRows, padded = (n + kRows - 1) / kRows * kRows;
    for (int64_t g = 0; g < padded; g += kRows)
      PackGroup(codes + (c0 + g) * pairs, scales + (c0 + g) * blocks, K, std::min(kRows, n - g),
                pc + g * pairs, ps + g * blocks);
    bool normal = false;  // only the AVX3 tiles read it
#if HWY_TARGET == HWY_AVX3
    normal = mxfp4_scales_normal(ps, padded * blocks);
#endif
    float* yc = y + (c0 - row0);
    if (whole > 0) Mxfp4LanesRows(xh, xf, T, pc, ps, K, 0, whole, yc, ldy, normal, round);
    if (padded > whole) {  // the ragged group: 16 outputs per token, n - whole of them kept
      ragged.resize(static_cast<size_t>(T * kRows));
      Mxfp4LanesRows(xh, xf, T, pc, ps, K, whole, kRows, ragged.data(), kRows, normal, round);
      for (int64_t t = 0; t < T; ++t)
        std::memcpy(yc + t * ldy + whole, ragged.data() + t * kRows,
                    static_cast<size_t>(n - whole) * sizeof(float));
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(Mxfp4LanesRows);
HWY_EXPORT(Mxfp4LanesRowsRowMajor);

void mxfp4_lanes_rows(const bf16* xh, const float* x, int64_t T, const uint8_t* codes,
                      const uint8_t* scales, int64_t N, int64_t K, int64_t row0, int64_t rows,
                      float* y, int64_t ldy, Mxfp4RowsOptions opt) {
  assert(mxfp4_lanes_fit(N, K) && row0 % kMxfp4LaneRows == 0 && rows % kMxfp4LaneRows == 0 &&
         row0 >= 0 && rows >= 0 && row0 + rows <= N);
  assert(!opt.normal_scales ||
         mxfp4_scales_normal(scales + row0 * (K / kMxfp4BlockSize), rows * (K / kMxfp4BlockSize)));
  (void)N;
  if (T <= 0 || rows <= 0) return;
  HWY_DYNAMIC_DISPATCH(Mxfp4LanesRows)
  (reinterpret_cast<const uint16_t*>(xh), x, T, codes, scales, K, row0, rows, y, ldy,
   opt.normal_scales, opt.round_bf16);
}

void mxfp4_lanes_rows_row_major(const bf16* xh, const float* x, int64_t T, const uint8_t* codes,
                                const uint8_t* scales, int64_t N, int64_t K, int64_t row0,
                                int64_t rows, float* y, int64_t ldy, bool round_bf16) {
  assert(K % kMxfp4BlockSize == 0 && row0 >= 0 && rows >= 0 && row0 + rows <= N);
  (void)N;
  if (T <= 0 || rows <= 0) return;
  HWY_DYNAMIC_DISPATCH(Mxfp4LanesRowsRowMajor)
  (reinterpret_cast<const uint16_t*>(xh), x, T, codes, scales, K, row0, rows, y, ldy, round_bf16);
}

}  // namespace attnres
#endif  // HWY_ONCE
