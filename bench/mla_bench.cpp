// MLA micro-benchmarks at Kimi-K3's shape (96 heads, nope 128, rope 64, v 128, kv_lora_rank
// 512; bf16 kv_b_proj), the dispatched kernels (mla_hwy.cpp) and their scalar twins in the same
// binary (Arg 0 = dispatched, 1 = `_ref`), each against its hardware limit:
//  - BM_MlaDecodeAbsorbed: one query token over an N = 4096 context of f32 latents (c_kv
//    [N, 512] + k_rot [N, 64], as blocks.cpp reads the cache: 9 MiB). The step is memory-bound:
//    it must read the latents (twice: scores, then o_lat) and the absorbed weights W_UK, W_UV
//    (24 MiB bf16: the per-head copies; the twin reads kv_b_proj). latent_GB_s = latent bytes /
//    time, GB_s = (latent + weight bytes, each counted once) / time, frac_read = GB_s / STREAM
//    read. Each call uses another layer's cache and weights, cycling through >= 3x the last-level
//    cache (24 MLA layers hold 216 MiB of latents at N = 4096). With 96 heads the step is
//    compute-bound in fact (~0.8 GFLOP per token at N = 4096, ~96 FLOPs per latent byte), so
//    GFLOP_s and frac_fma_peak (against fma_peak_gflop_s()) are reported too.
//  - BM_MlaPrefillExpanded: T = N = 512 query tokens (a prompt with no earlier context), keys
//    and values expanded [N, 96, 256] f32. Compute-bound: GFLOP/s counts 2 FLOPs per causal
//    multiply-add (scores over nope + rope, weighted values over v), frac_fma_peak divides by
//    fma_peak_gflop_s() (bench/kda_bench.cpp).
//   ./attnres_bench --benchmark_filter=Mla
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "bench_limits.h"
#include "fma_peak.h"
#include "io/weights.h"
#include "kernels/matmul.h"
#include "kernels/mla.h"
#include "kernels/stream_probe.h"
#include "util/memory.h"
#include "util/numeric.h"

namespace attnres::bench {
namespace {

constexpr MlaDims kDims{96, 128, 64, 128, 512, 0.07216878f};  // scale = 1 / sqrt(192)

std::vector<float> randn(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = nd(rng);
  return v;
}

void BM_MlaDecodeAbsorbed(benchmark::State& state) {
  const bool ref = state.range(0) == 1;
  const int64_t N = state.range(1), T = 1, H = kDims.H, r = kDims.r, rope = kDims.rope;
  const int64_t rows = H * (kDims.nope + kDims.v);
  const double latent_bytes = static_cast<double>(N * (r + rope)) * sizeof(float);
  const double weight_bytes = static_cast<double>(rows * r) * sizeof(bf16);
  const int64_t layers = std::max<int64_t>(
      2, static_cast<int64_t>(std::ceil(3.0 * static_cast<double>(last_level_cache_bytes()) /
                                        (latent_bytes + weight_bytes))));
  std::vector<float> c_kv = randn(layers * N * r, 1, 1.0f),
                     k_rot = randn(layers * N * rope, 2, 1.0f);
  const std::vector<float> wf = randn(layers * rows * r, 3, 0.05f);
  std::vector<bf16> w(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w[i] = f32_to_bf16(wf[i]);
  // Each layer's kv_b_proj and its absorbed per-head copies, as the loader makes them.
  std::vector<TensorView> views(static_cast<size_t>(layers));
  std::vector<std::vector<TensorView>> uk_t(views.size()), uv(views.size());
  WeightMemory memory;
  for (int64_t l = 0; l < layers; ++l) {
    const auto i = static_cast<size_t>(l);
    TensorView& v = views[i];
    v.dtype = DType::kBF16;
    v.shape = {rows, r};
    v.data = reinterpret_cast<const std::byte*>(w.data() + l * rows * r);
    v.nbytes = static_cast<size_t>(rows * r) * sizeof(bf16);
    absorbed_head_weights(v, kDims.nope, kDims.v, memory, uk_t[i], uv[i]);
  }
  const std::vector<float> q = randn(T * H * (kDims.nope + rope), 4, 1.0f);
  std::vector<float> o(static_cast<size_t>(T * H * kDims.v));
  std::vector<float> scratch(static_cast<size_t>(mla_absorbed_scratch_floats(kDims, N, T)));
  // The f32-context overload (the twin has no bf16 one).
  using Absorbed = void (*)(const MlaDims&, const float*, int64_t, const float*, const float*,
                            int64_t, const MlaAbsorbedWeights&, float*, float*);
  const Absorbed fn = ref ? Absorbed{mla_attend_absorbed_ref} : Absorbed{mla_attend_absorbed};
  int64_t l = 0;
  for (auto _ : state) {
    fn(kDims, q.data(), T, c_kv.data() + l * N * r, k_rot.data() + l * N * rope, N,
       MlaAbsorbedWeights{&views[static_cast<size_t>(l)], uk_t[static_cast<size_t>(l)].data(),
                          uv[static_cast<size_t>(l)].data()},
       o.data(), scratch.data());
    benchmark::ClobberMemory();
    l = (l + 1) % layers;
  }
  const StreamResult& lim = stream_limit();
  const double gb = (latent_bytes + weight_bytes) * 1e-9;
  state.counters["latent_GB_s"] =
      benchmark::Counter(latent_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB_s"] = benchmark::Counter(gb, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["stream_read_GB_s"] = lim.read_gb_s;
  state.counters["frac_read"] =
      benchmark::Counter(gb / lim.read_gb_s, benchmark::Counter::kIsIterationInvariantRate);
  // With 96 heads the step is in fact compute-bound: 2 H N (r + rope) multiply-adds for the
  // scores and 2 H N r for o_lat, plus 2 H r (nope + v) for the absorbed projections.
  const double gflop = 2.0 * static_cast<double>(H) *
                       (static_cast<double>(N) * static_cast<double>(2 * r + rope) +
                        static_cast<double>(r) * static_cast<double>(kDims.nope + kDims.v)) *
                       1e-9;
  set_flop_counters(state, gflop);
  state.SetLabel(impl_label(ref));
}

void BM_MlaPrefillExpanded(benchmark::State& state) {
  const bool ref = state.range(0) == 1;
  const int64_t N = state.range(1), T = N, H = kDims.H;
  const int64_t kvw = kDims.nope + kDims.v, qw = kDims.nope + kDims.rope;
  const std::vector<float> q = randn(T * H * qw, 5, 1.0f);
  const std::vector<float> kv = randn(N * H * kvw, 6, 1.0f), k_rot = randn(N * kDims.rope, 7, 1.0f);
  std::vector<float> o(static_cast<size_t>(T * H * kDims.v));
  std::vector<float> scratch(static_cast<size_t>(mla_expanded_scratch_floats(N, T)));
  const auto fn = ref ? mla_attend_expanded_ref : mla_attend_expanded;
  for (auto _ : state) {
    fn(kDims, q.data(), T, kv.data(), k_rot.data(), N, o.data(), scratch.data());
    benchmark::ClobberMemory();
  }
  // Query t attends N - T + t + 1 tokens: sum over t of the context, times per-pair work.
  const double pairs = static_cast<double>(T) * static_cast<double>(N - T) +
                       static_cast<double>(T) * static_cast<double>(T + 1) / 2.0;
  const double gflop = 2.0 * pairs * static_cast<double>(H * (qw + kDims.v)) * 1e-9;
  set_flop_counters(state, gflop);
  state.SetLabel(impl_label(ref));
}

BENCHMARK(BM_MlaDecodeAbsorbed)
    ->Args({0, 4096})
    ->Args({1, 4096})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_MlaPrefillExpanded)
    ->Args({0, 512})
    ->Args({1, 512})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace attnres::bench
