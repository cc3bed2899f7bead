// Compute-peak probe (compute_probe.h), one copy per Highway target for the f32 chain.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/compute_probe.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstdint>

#include "util/cpu.h"

#ifndef ATTNRES_COMPUTE_PROBE_ONCE
#define ATTNRES_COMPUTE_PROBE_ONCE
namespace attnres {
// Independent accumulators per thread (more than an FMA's latency x throughput).
constexpr int kProbeChains = 12;
}  // namespace attnres
#endif

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float FmaChain(int64_t iters) {
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  V acc[kProbeChains];
  for (int i = 0; i < kProbeChains; ++i) acc[i] = hn::Set(d, 1.0f + 1e-3f * static_cast<float>(i));
  const V m = hn::Set(d, 0.9999999f), c = hn::Set(d, 1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kProbeChains; ++i) acc[i] = hn::MulAdd(acc[i], m, c);
  V sum = acc[0];
  for (int i = 1; i < kProbeChains; ++i) sum = hn::Add(sum, acc[i]);
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

int64_t FmaLanes() {
  return static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
}

#if HWY_TARGET == HWY_AVX3
__attribute__((target(HWY_TARGET_STR ",avx512bf16"))) float DotBf16Chain(int64_t iters) {
  __m512 acc[kProbeChains];
  for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3f80));  // 1.0
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi16(0x3400));  // 2^-23
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kProbeChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  __m512 sum = acc[0];
  for (int i = 1; i < kProbeChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_reduce_add_ps(sum);
}
#else
float DotBf16Chain(int64_t) {
  return 0.0f;  // no AVX512_BF16 on this target: measure_compute_peak never calls it
}
#endif

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <chrono>
#include <vector>

#include "kernels/compute_probe.h"
#include "kernels/matmul.h"
#include "util/parallel.h"

namespace attnres {

HWY_EXPORT(FmaChain);
HWY_EXPORT(FmaLanes);
HWY_EXPORT(DotBf16Chain);

ComputeProbeResult compute_probe(bool bf16_dot, int reps) {
  constexpr int64_t kIters = 4'000'000;
  ComputeProbeResult p;
  p.threads = parallel_threads();
  // matmul_bf16_uses_dot_product(): the dispatched target is AVX3 and the CPU has AVX512_BF16.
  const bool dot = bf16_dot && matmul_bf16_uses_dot_product();
  const auto dot_chain = HWY_DYNAMIC_DISPATCH(DotBf16Chain);
  const double lanes = static_cast<double>(HWY_DYNAMIC_DISPATCH(FmaLanes)());
  // FLOPs per instruction: an f32 FMA is 2 per lane; vdpbf16ps 2 multiply-adds per lane.
  const double flops = dot ? 4.0 * 16 : 2.0 * lanes;
  p.instruction = dot ? "vdpbf16ps" : std::string("f32 fma (") + matmul_simd_target() + ")";
  const auto fma = HWY_DYNAMIC_DISPATCH(FmaChain);
  for (int rep = 0; rep < std::max(1, reps); ++rep) {
    std::vector<float> sinks(static_cast<size_t>(p.threads));
    const auto t0 = std::chrono::steady_clock::now();
    parallel_tasks(p.threads, [&](int64_t i) {
      sinks[static_cast<size_t>(i)] = dot ? dot_chain(kIters) : fma(kIters);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    volatile float sink = 0;
    for (float x : sinks) sink = sink + x;
    p.gflop_s = std::max(p.gflop_s,
                         flops * kProbeChains * static_cast<double>(kIters * p.threads) / s * 1e-9);
  }
  return p;
}

}  // namespace attnres
#endif  // HWY_ONCE
