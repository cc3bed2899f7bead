// Turning a runtime count into a template argument, for the dispatched tile kernels
// (matmul_hwy.cpp, matmul_lanes_hwy.cpp): a tile's token or vector count selects its
// register-tile instantiation. Per-target include guard (Highway's -inl.h convention): include
// after <hwy/highway.h> inside a file compiled once per target by foreach_target.h, so the call
// inlines into each target's code.
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

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#endif  // ATTNRES_KERNELS_COUNT_HWY_INL_H_
