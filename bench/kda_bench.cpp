// KDA micro-benchmarks at Kimi-K3's shape (96 heads, dk = dv = 128; config.json
// linear_attn_config), the dispatched kernels (kda_hwy.cpp) and their scalar twins in the same
// binary (Arg 0 = dispatched, 1 = `_ref`), each against its hardware limit:
//  - BM_KdaDecode: one recurrent step (T = 1), the decode hot path. It must read and write the
//    whole f32 state [H, dk, dv] (6 MiB per layer), so the limit is memory bandwidth: bytes =
//    2 x state bytes per call; frac_copy = (bytes / time) / STREAM copy (the same read + write
//    pattern; STREAM counts no write-allocate traffic, and the in-place update has none),
//    frac_read against the STREAM read rate. Each call updates another layer's state, cycling
//    through >= 3x the last-level cache, so the state comes from DRAM as in a real decode (69
//    KDA layers = 414 MiB of state).
//  - BM_KdaPrefill: the chunked form over T = 512 tokens, chunk 64 (the engine's default). The
//    limit is the FMA rate: GFLOP/s counts the algorithm's useful multiply-adds (2 FLOPs each;
//    causal triangles counted once, exponentials not counted, see prefill_flops()) and
//    frac_fma_peak divides it by fma_peak_gflop_s(), a probe of independent FMAs on the same
//    Highway target with all threads, measured once per process.
//   ./attnres_bench --benchmark_filter=Kda
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "../bench/kda_bench.cpp"  // found through the src/ include path
#include <hwy/foreach_target.h>                      // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstdint>

// FMA-throughput probe, compiled once per target.
HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace bench {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// `iters` rounds of kAcc independent FMA chains (enough to cover FMA latency x issue width on
// current x86 cores); returns a value depending on every result so nothing is elided.
float FmaLoop(int64_t iters) {
  constexpr int kAcc = 12;
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  V acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = hn::Set(d, 1.0f + 1e-3f * static_cast<float>(i));
  const V m = hn::Set(d, 0.9999999f), c = hn::Set(d, 1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < kAcc; ++i) acc[i] = hn::MulAdd(acc[i], m, c);
  V sum = acc[0];
  for (int i = 1; i < kAcc; ++i) sum = hn::Add(sum, acc[i]);
  return hn::GetLane(hn::SumOfLanes(d, sum));
}

int64_t FmaLanes() {
  return static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
}

}  // namespace HWY_NAMESPACE
}  // namespace bench
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <benchmark/benchmark.h>
#include "util/parallel.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <vector>

#include "bench_limits.h"
#include "fma_peak.h"
#include "kernels/kda.h"
#include "kernels/matmul.h"
#include "kernels/stream_probe.h"

namespace attnres::bench {

HWY_EXPORT(FmaLoop);
HWY_EXPORT(FmaLanes);

double fma_peak_gflop_s() {
  static const double peak = [] {
    constexpr int64_t kIters = 20'000'000, kAcc = 12;
    const auto loop = HWY_DYNAMIC_DISPATCH(FmaLoop);
    const double lanes = static_cast<double>(HWY_DYNAMIC_DISPATCH(FmaLanes)());
    double best = 0.0;
    for (int rep = 0; rep < 5; ++rep) {
      const int threads = parallel_threads();
      std::vector<float> sinks(static_cast<size_t>(threads));
      const auto t0 = std::chrono::steady_clock::now();
      parallel_tasks(threads, [&](int64_t i) { sinks[static_cast<size_t>(i)] = loop(kIters); });
      float sink = 0.0f;
      for (float x : sinks) sink += x;
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      benchmark::DoNotOptimize(sink);
      best = std::max(best, 2.0 * kAcc * lanes * static_cast<double>(kIters * threads) / s * 1e-9);
    }
    return best;
  }();
  return peak;
}

namespace {

constexpr int64_t kH = 96, kD = 128;

struct KdaInputs {
  std::vector<float> q, k, v, g, beta;
  KdaInputs(int64_t T, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    const size_t n = static_cast<size_t>(T * kH * kD);
    q.resize(n);
    k.resize(n);
    v.resize(n);
    g.resize(n);
    beta.resize(static_cast<size_t>(T * kH));
    for (size_t i = 0; i < n; ++i) {
      q[i] = nd(rng);
      k[i] = nd(rng);
      v[i] = nd(rng);
      g[i] = -0.2f * ud(rng);  // decays near 1: the state neither dies out nor blows up
    }
    for (float& b : beta) b = 0.2f + 0.6f * ud(rng);
    for (size_t r = 0; r < static_cast<size_t>(T * kH); ++r) {  // unit k, q scaled by dk^-1/2
      double sq = 0.0, sk = 0.0;
      for (size_t i = 0; i < kD; ++i) {
        sq += double{q[r * kD + i]} * q[r * kD + i];
        sk += double{k[r * kD + i]} * k[r * kD + i];
      }
      for (size_t i = 0; i < kD; ++i) {
        q[r * kD + i] = static_cast<float>(q[r * kD + i] / std::sqrt(sq * kD));
        k[r * kD + i] = static_cast<float>(k[r * kD + i] / std::sqrt(sk));
      }
    }
  }
};

void BM_KdaDecode(benchmark::State& state) {
  const bool ref = state.range(0) == 1;
  const int64_t S = kH * kD * kD;  // floats per layer state
  const double state_bytes = static_cast<double>(S) * sizeof(float);
  const int64_t layers = std::max<int64_t>(
      2, static_cast<int64_t>(
             std::ceil(3.0 * static_cast<double>(last_level_cache_bytes()) / state_bytes)));
  std::vector<float> states(static_cast<size_t>(layers * S));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.1f);
  for (float& x : states) x = nd(rng);
  const KdaInputs in(1, 7);
  std::vector<float> o(static_cast<size_t>(kH * kD));
  const auto fn = ref ? kda_recurrent_ref : kda_recurrent;
  int64_t layer = 0;
  for (auto _ : state) {
    fn(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), 1, kH, kD, kD,
       states.data() + layer * S, o.data());
    benchmark::ClobberMemory();
    layer = (layer + 1) % layers;
  }
  const double gb = 2.0 * state_bytes * 1e-9;
  const StreamResult& lim = stream_limit();
  state.counters["GB_s"] = benchmark::Counter(gb, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["stream_copy_GB_s"] = lim.copy_gb_s;
  state.counters["stream_read_GB_s"] = lim.read_gb_s;
  state.counters["frac_copy"] =
      benchmark::Counter(gb / lim.copy_gb_s, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["frac_read"] =
      benchmark::Counter(gb / lim.read_gb_s, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["state_MiB"] = state_bytes / (1 << 20);
  state.SetLabel(impl_label(ref));
}

// Useful FLOPs of one chunked call (per head and chunk of L: A and Aqk lower triangles over dk,
// the forward substitution, w and u, v_new = u - w S, o = q S + Aqk v_new, the state update).
double prefill_flops(int64_t T, int64_t chunk) {
  double f = 0.0;
  const double dk = kD, dv = kD;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const double L = static_cast<double>(std::min(chunk, T - t0));
    const double tri = L * (L + 1) / 2;
    f += 2.0 * (L * (L - 1) / 2 * dk + L * L * L / 6 + tri * (dk + dv) + L * dk * dv + tri * dk +
                L * dk * dv + tri * dv + L * dk * dv);
  }
  return f * static_cast<double>(kH);
}

void BM_KdaPrefill(benchmark::State& state) {
  const bool ref = state.range(0) == 1;
  const int64_t T = state.range(1), chunk = 64;
  const KdaInputs in(T, 11);
  std::vector<float> s0(static_cast<size_t>(kH * kD * kD), 0.0f), s = s0;
  std::vector<float> o(static_cast<size_t>(T * kH * kD));
  std::vector<float> scratch(static_cast<size_t>(kda_chunk_scratch_floats(kH, chunk, kD, kD)));
  const auto fn = ref ? kda_chunked_ref : kda_chunked;
  for (auto _ : state) {
    fn(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), T, kH, kD, kD, chunk,
       s.data(), o.data(), scratch.data());
    benchmark::ClobberMemory();
  }
  const double gflop = prefill_flops(T, chunk) * 1e-9;
  set_flop_counters(state, gflop);
  state.counters["tok_s"] =
      benchmark::Counter(static_cast<double>(T), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(impl_label(ref));
}

BENCHMARK(BM_KdaDecode)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_KdaPrefill)
    ->Args({0, 512})
    ->Args({1, 512})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace attnres::bench
#endif  // HWY_ONCE
