// Turning a runtime count into a template argument, for the dispatched tile kernels
// (matmul_hwy.cpp, matmul_lanes_hwy.cpp, mxfp4_lanes_hwy.cpp): a tile's token or vector count
// selects its register-tile instantiation; and near-equal token tiles. Per-target include guard
// (Highway's -inl.h convention): include after <hwy/highway.h> inside a file compiled once per
// target by foreach_target.h, so the call inlines into each target's code.
#if defined(ATTNRES_KERNELS_COUNT_HWY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTNRES_KERNELS_COUNT_HWY_INL_H_
#undef ATTNRES_KERNELS_COUNT_HWY_INL_H_
#else
#define ATTNRES_KERNELS_COUNT_HWY_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <type_traits>

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {

// fn(std::integral_constant<int, n>()) for a runtime 1 <= n <= kMax.
template <int kMax, class Fn>
HWY_INLINE void WithCount(int64_t n, const Fn& fn) {
  if constexpr (kMax > 1) {
    if (n < kMax) return WithCount<kMax - 1>(n, fn);
  }
  fn(std::integral_constant<int, kMax>());
}

// Calls tile(t, mr) over tokens [0, n) in ceil(n / most) tiles of near-equal size (most = 6:
// 7 = 4 + 3), so no tile is much shorter than the others.
template <class Tile>
HWY_INLINE void ForEachTokenTile(int64_t n, int64_t most, const Tile& tile) {
  const int64_t tiles = (n + most - 1) / most;
  int64_t t = 0;
  for (int64_t i = 0; i < tiles; ++i) {
    const int64_t mr = n / tiles + (i < n % tiles ? 1 : 0);
    tile(t, mr);
    t += mr;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#endif  // ATTNRES_KERNELS_COUNT_HWY_INL_H_
