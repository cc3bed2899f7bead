// silu_mul (activation.h) with Highway runtime dispatch: out = SiLU(gate) * up with the scalar
// twin's formula and order, (gate / (1 + exp(-gate))) * up, Highway's Exp (<= 1 ulp) in place
// of expf; with bf16_out the product is rounded to bf16 in the vector exactly as round_bf16.
//
// Every element goes through the same lane-wise vector code (the ragged end in a zero-padded
// vector), so its value depends only on its (gate, up) pair: independent of its position and
// of the thread count. Blocks of kBlock elements (a multiple of every vector width) are split
// statically over threads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/silu_hwy.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/activation.h"
#include "kernels/parallel.h"
#include "kernels/rowops_hwy-inl.h"
#include "util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// out[i] for i < n (rounded to bf16 with bf16_out, always for bf16 out); f32 out may alias gate
// or up (each vector is loaded before it is stored).
template <typename T>
HWY_INLINE void SiluMulSpanT(const float* gate, const float* up, int64_t n, bool bf16_out, T* out) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  auto f = [&](VF g, VF u) {
    const VF v = hn::Mul(SiluVec(d, g), u);
    return bf16_out || std::is_same_v<T, bf16> ? CastT<bf16>(d, v) : v;
  };
  int64_t i = 0;
  for (; i + L <= n; i += L) StoreT(d, f(hn::LoadU(d, gate + i), hn::LoadU(d, up + i)), out + i);
  if (i < n) {
    const size_t rest = static_cast<size_t>(n - i);
    StoreTail(d, f(LoadTail(d, gate + i, rest), LoadTail(d, up + i, rest)), out + i, rest);
  }
}
void SiluMulSpan(const float* gate, const float* up, int64_t n, bool bf16_out, float* out) {
  SiluMulSpanT(gate, up, n, bf16_out, out);
}
void SiluMulSpanBf16(const float* gate, const float* up, int64_t n, bf16* out) {
  SiluMulSpanT(gate, up, n, true, out);
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace attnres {

HWY_EXPORT(SiluMulSpan);
HWY_EXPORT(SiluMulSpanBf16);

namespace {

// span(i0, m) over [0, n) in blocks of m elements.
template <typename Span>
void silu_blocks(int64_t n, const Span& span) {
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_ranges(blocks, n > kParallelMinWork, [&](int64_t blk_begin, int64_t blk_end) {
    for (int64_t blk = blk_begin; blk < blk_end; ++blk) {
      const int64_t i0 = blk * kBlock;
      span(i0, std::min(kBlock, n - i0));
    }
  });
}

}  // namespace

void silu_mul(const float* gate, const float* up, int64_t n, bool bf16_out, float* out) {
  silu_blocks(n, [&](int64_t i0, int64_t m) {
    HWY_DYNAMIC_DISPATCH(SiluMulSpan)(gate + i0, up + i0, m, bf16_out, out + i0);
  });
}

void silu_mul(const float* gate, const float* up, int64_t n, bf16* out) {
  silu_blocks(n, [&](int64_t i0, int64_t m) {
    HWY_DYNAMIC_DISPATCH(SiluMulSpanBf16)(gate + i0, up + i0, m, out + i0);
  });
}

}  // namespace attnres
#endif  // HWY_ONCE
