// Row kernels at Kimi-K3 shapes (../shared/models/kimi-k3/config.json: hidden 7168, KDA 96 heads
// x 128 = 12288 channels, short conv width 4, gate lower bound -5, 896 experts top-16; also the
// 384-expert top-8 router), each as the dispatched Highway kernel (path 0) and its scalar twin
// NAME_ref (path 1) in the same binary, for T = 1 (decode) and T = 512 (prefill):
//   rms_norm (bf16 gain, bf16 output), l2_norm and gated_rms_norm (per head of 128),
//   route_sigmoid_topk, causal_conv1d_silu, kda_gate, silu_mul and situ (T x 3072, one
//   expert's width).
//
// Bytes per call count what the kernel must move: every input read once and every output
// written once (f32; gains bf16), as STREAM counts its arrays. Each call is timed (wall clock):
// best_GB_s = bytes / fastest call (the robust number on a shared machine, as STREAM's own
// best-of), GB_s = bytes / mean call; frac_triad = best_GB_s / this machine's STREAM triad
// bandwidth, frac_read = the input bytes alone per fastest call / STREAM read bandwidth
// (bench_limits.h, best of its passes, same process). A core's reads are what saturates first:
// an in-place kernel moves as many bytes out as in (no write-allocate reads, unlike triad's
// output), so its frac_triad can pass 1 while frac_read <= ~1. Calls whose
// data is below a quarter of the last-level cache (T = 1) run on hot buffers, as in a decode step
// where the previous kernel just wrote them: their fraction of STREAM can exceed 1 and says little;
// larger calls (T = 512) cycle through copies of their buffers spanning >= 3x the LLC, so every
// call streams from DRAM.
//   ./attnres_bench --benchmark_filter='Rows'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "bench_limits.h"
#include "kernels/activation.h"
#include "kernels/conv_gate.h"
#include "kernels/norm.h"
#include "kernels/router.h"
#include "util/cpu.h"

namespace attnres::bench {
namespace {

constexpr int64_t kHidden = 7168, kHeads = 96, kHeadDim = 128, kChannels = kHeads * kHeadDim;
constexpr int kConvWidth = 4;

// `copies` consecutive copies of `per` random floats (normal, sd `scale`).
struct Cycled {
  std::vector<float> data;
  int64_t per = 0, copies = 1;
  Cycled(int64_t n, int64_t ncopies, uint32_t seed, float scale = 1.0f) : per(n), copies(ncopies) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, scale);
    data.resize(static_cast<size_t>(n * ncopies));
    for (float& f : data) f = nd(rng);
  }
  float* at(int64_t c) { return data.data() + (c % copies) * per; }
};

// Copies so that one cycle moves >= 3x the last-level cache; 1 (hot) below LLC / 4.
int64_t copies_for(int64_t bytes_per_call) {
  const int64_t llc = static_cast<int64_t>(last_level_cache_bytes());
  if (bytes_per_call < llc / 4) return 1;
  return std::max<int64_t>(4, (8 * llc + bytes_per_call - 1) / bytes_per_call);
}

// Runs `call(c)` for c = 0, 1, ... once per iteration, timing each call, and sets the counters.
template <class Call>
void run(benchmark::State& state, double bytes_per_call, double read_bytes, bool fast,
         const Call& call) {
  double best = 1e30;
  int64_t c = 0;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    call(c++);
    benchmark::ClobberMemory();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const StreamResult& lim = stream_limit();
  const double best_gb_s = bytes_per_call / best * 1e-9;
  state.counters["MiB"] = bytes_per_call / (1 << 20);
  state.counters["best_us"] = best * 1e6;
  state.counters["GB_s"] =
      benchmark::Counter(bytes_per_call * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["best_GB_s"] = best_gb_s;
  state.counters["frac_triad"] = best_gb_s / lim.triad_gb_s;
  state.counters["frac_read"] = read_bytes / best * 1e-9 / lim.read_gb_s;
  state.counters["stream_triad_GB_s"] = lim.triad_gb_s;
  state.SetLabel(fast ? "fast" : "ref");
}

std::vector<bf16> bf16_gain(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(1.0f, 0.2f);
  std::vector<bf16> g(static_cast<size_t>(n));
  for (bf16& v : g) v = f32_to_bf16(nd(rng));
  return g;
}

TensorView gain_view(const std::vector<bf16>& g) {
  TensorView v;
  v.dtype = DType::kBF16;
  v.shape = {static_cast<int64_t>(g.size())};
  v.data = reinterpret_cast<const std::byte*>(g.data());
  v.nbytes = g.size() * sizeof(bf16);
  return v;
}

// args: T, path (0 fast, 1 ref). x [T, 7168] -> y [T, 7168], bf16 gain and output.
void BM_RowsRmsNorm(benchmark::State& state) {
  const int64_t T = state.range(0), n = T * kHidden;
  const bool fast = state.range(1) == 0;
  const double bytes = 2.0 * static_cast<double>(n) * 4 + kHidden * 2;
  const double reads = static_cast<double>(n) * 4 + kHidden * 2;  // x, gain
  const int64_t copies = copies_for(static_cast<int64_t>(bytes));
  Cycled x(n, copies, 1), y(n, copies, 2);
  const std::vector<bf16> g = bf16_gain(kHidden, 3);
  const TensorView gv = gain_view(g);
  run(state, bytes, reads, fast, [&](int64_t c) {
    (fast ? rms_norm : rms_norm_ref)(x.at(c), T, kHidden, gv, 1e-5f, true, y.at(c));
  });
}

// args: T, path. KDA's q/k L2 norm: [T * 96, 128] in place.
void BM_RowsL2Norm(benchmark::State& state) {
  const int64_t T = state.range(0), n = T * kChannels;
  const bool fast = state.range(1) == 0;
  const double bytes = 2.0 * static_cast<double>(n) * 4;
  const double reads = static_cast<double>(n) * 4;  // x (rewritten in place)
  Cycled x(n, copies_for(static_cast<int64_t>(bytes)), 4);
  run(state, bytes, reads, fast, [&](int64_t c) {
    (fast ? l2_norm : l2_norm_ref)(x.at(c), T * kHeads, kHeadDim, 1e-6f, 0.0883883f, x.at(c));
  });
}

// args: T, path. KDA's output norm: o, gate [T * 96, 128], y = o, bf16 gain and output.
void BM_RowsGatedRmsNorm(benchmark::State& state) {
  const int64_t T = state.range(0), n = T * kChannels;
  const bool fast = state.range(1) == 0;
  const double bytes = 3.0 * static_cast<double>(n) * 4 + kHeadDim * 2;
  const double reads = 2.0 * static_cast<double>(n) * 4 + kHeadDim * 2;  // o, gate, gain
  const int64_t copies = copies_for(static_cast<int64_t>(bytes));
  Cycled o(n, copies, 5), gate(n, copies, 6, 3.0f);
  const std::vector<bf16> g = bf16_gain(kHeadDim, 7);
  const TensorView gv = gain_view(g);
  run(state, bytes, reads, fast, [&](int64_t c) {
    (fast ? gated_rms_norm : gated_rms_norm_ref)(o.at(c), gate.at(c), T * kHeads, kHeadDim, gv,
                                                 1e-5f, true, o.at(c));
  });
}

// args: T, E, K, path. logits [T, E] read, scratch [T, E] written, ids + weights [T, K].
void BM_RowsRouter(benchmark::State& state) {
  const int64_t T = state.range(0), E = state.range(1), K = state.range(2);
  const bool fast = state.range(3) == 0;
  const double bytes = 2.0 * static_cast<double>(T * E) * 4 + static_cast<double>(E) * 4 +
                       static_cast<double>(T * K) * 8;
  const double reads = static_cast<double>(T * E) * 4 + static_cast<double>(E) * 4;
  // At least 1024 distinct tokens per cycle: the selection branches on the scores, and on a
  // repeated token the branch predictor would learn them.
  const int64_t copies =
      std::max(copies_for(static_cast<int64_t>(bytes)), std::max<int64_t>(4, 1024 / T));
  Cycled logits(T * E, copies, 8, 2.0f), scratch(T * E, copies, 9), bias(E, 1, 10, 0.05f);
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  std::vector<float> w(static_cast<size_t>(T * K));
  RouterOptions opt;
  opt.top_k = K;
  opt.scaling = 2.5f;
  run(state, bytes, reads, fast, [&](int64_t c) {
    (fast ? route_sigmoid_topk : route_sigmoid_topk_ref)(logits.at(c), bias.at(0), T, E, opt,
                                                         ids.data(), w.data(), scratch.at(c));
  });
}

// args: T, path. One of q/k/v's short convolutions: x [T, 12288] in place, W = 4, state carried.
void BM_RowsConv(benchmark::State& state) {
  const int64_t T = state.range(0), n = T * kChannels;
  const bool fast = state.range(1) == 0;
  const double bytes =
      2.0 * static_cast<double>(n) * 4 + kChannels * (kConvWidth + 2 * (kConvWidth - 1)) * 4.0;
  const double reads = static_cast<double>(n) * 4 + kChannels * (2 * kConvWidth - 1) * 4.0;
  Cycled x(n, copies_for(static_cast<int64_t>(bytes)), 11, 0.3f);
  Cycled w(kChannels * kConvWidth, 1, 12, 0.5f), st(kChannels * (kConvWidth - 1), 1, 13, 0.3f);
  run(state, bytes, reads, fast, [&](int64_t c) {
    (fast ? causal_conv1d_silu : causal_conv1d_silu_ref)(x.at(c), T, kChannels, w.at(0), kConvWidth,
                                                         st.at(0), x.at(c));
  });
}

// args: T, path. Forget gate with K3's lower bound -5: f [T, 96 * 128] in place.
void BM_RowsKdaGate(benchmark::State& state) {
  const int64_t T = state.range(0), n = T * kChannels;
  const bool fast = state.range(1) == 0;
  const double bytes = 2.0 * static_cast<double>(n) * 4 + kChannels * 4.0;
  const double reads = static_cast<double>(n) * 4 + kChannels * 4.0;  // f, dt_bias
  Cycled f(n, copies_for(static_cast<int64_t>(bytes)), 14, 2.0f);
  Cycled dt(kChannels, 1, 15, 0.5f), a_log(kHeads, 1, 16, 0.5f);
  run(state, bytes, reads, fast, [&](int64_t c) {
    (fast ? kda_gate : kda_gate_ref)(f.at(c), T, kHeads, kHeadDim, a_log.at(0), dt.at(0),
                                     std::optional<float>(-5.0f), f.at(c));
  });
}

// args: T, path. out = act(gate, up) over T x 3072 (one expert's width), f32 output; act(fast,
// gate, up, n, out) runs the fast kernel or its twin. Inputs: gate ~ N(0, 3), up ~ N(0, up_sd).
template <class Act>
void gated_activation(benchmark::State& state, uint32_t seed, float up_sd, const Act& act) {
  const int64_t T = state.range(0), n = T * 3072;
  const bool fast = state.range(1) == 0;
  const double bytes = 3.0 * static_cast<double>(n) * 4;
  const double reads = 2.0 * static_cast<double>(n) * 4;  // gate, up
  const int64_t copies = copies_for(static_cast<int64_t>(bytes));
  Cycled g(n, copies, seed, 3.0f), u(n, copies, seed + 1, up_sd), out(n, copies, seed + 2);
  run(state, bytes, reads, fast, [&](int64_t c) { act(fast, g.at(c), u.at(c), n, out.at(c)); });
}

// silu(gate) * up (Kimi-Linear's activation).
void BM_RowsSiluMul(benchmark::State& state) {
  gated_activation(state, 17, 1.0f,
                   [](bool fast, const float* g, const float* u, int64_t n, float* out) {
                     if (fast)
                       silu_mul(g, u, n, false, out);
                     else
                       silu_mul_ref(g, u, n, false, out);
                   });
}

// SiTU(gate, up) (Kimi-K3's activation, beta 4 / linear beta 25 as in the published config).
void BM_RowsSitu(benchmark::State& state) {
  gated_activation(state, 20, 10.0f,
                   [](bool fast, const float* g, const float* u, int64_t n, float* out) {
                     if (fast)
                       situ(g, u, n, 4.0f, 25.0f, false, out);
                     else
                       situ_ref(g, u, n, 4.0f, 25.0f, false, out);
                   });
}

void rows_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"T", "path"});
  for (int64_t T : {1, 512})
    for (int64_t path : {0, 1}) b->Args({T, path});
  b->UseRealTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_RowsRmsNorm)->Apply(rows_args);
BENCHMARK(BM_RowsL2Norm)->Apply(rows_args);
BENCHMARK(BM_RowsGatedRmsNorm)->Apply(rows_args);
BENCHMARK(BM_RowsConv)->Apply(rows_args);
BENCHMARK(BM_RowsKdaGate)->Apply(rows_args);
BENCHMARK(BM_RowsSiluMul)->Apply(rows_args);
BENCHMARK(BM_RowsSitu)->Apply(rows_args);
BENCHMARK(BM_RowsRouter)
    ->ArgNames({"T", "E", "K", "path"})
    ->Args({1, 896, 16, 0})
    ->Args({1, 896, 16, 1})
    ->Args({512, 896, 16, 0})
    ->Args({512, 896, 16, 1})
    ->Args({1, 384, 8, 0})
    ->Args({1, 384, 8, 1})
    ->Args({512, 384, 8, 0})
    ->Args({512, 384, 8, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace attnres::bench
