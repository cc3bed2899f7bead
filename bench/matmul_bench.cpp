// Projection micro-benchmarks, each reporting its fraction of the relevant limit:
//  - GEMV (decode, T = 1; bf16 and MXFP4 weights): achieved weight GB/s and its fraction of this
//    machine's STREAM read and triad bandwidth (bench/stream_bench.cpp, same process), and of a
//    STREAM read pass of the same size timed right after each call (of_read_paired). Each call
//    reads a different copy of the weights, cycling through >= 3x the last-level cache, so the
//    weights come from DRAM as they do in a real decode (all layers together are GBs).
//  - GEMM (prefill, T > 1): GFLOP/s (2 T N K per call) and, counter vs_openblas, its fraction of
//    OpenBLAS measured on the same shape in the same process, call for call interleaved. Debian's
//    OpenBLAS 0.3.21 is built without BUILD_BFLOAT16 (no cblas_sbgemm symbol), so the baseline is
//    cblas_sgemm on the weights widened to f32 (same math, f32 FMA, exactly the same weight
//    values).
// Both libraries use all of the pool's threads (OpenBLAS: openblas_set_num_threads).
//   ./attnres_bench --benchmark_filter='Gemv|Gemm' (see docs/kernels.md for the full command)
#include <benchmark/benchmark.h>
#include <cblas.h>
#include "util/parallel.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_limits.h"
#include "kernels/compute_probe.h"
#include "kernels/matmul.h"
#include "kernels/matmul_lanes.h"
#include "util/cpu.h"
#include "util/memory.h"
#include "util/mxfp4_lanes.h"

namespace attnres::bench {
namespace {

constexpr int64_t kMiB = 1 << 20;

std::vector<float> random_f32(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = nd(rng);
  return v;
}

std::vector<bf16> random_bf16(int64_t n, uint32_t seed) {
  const std::vector<float> f = random_f32(n, seed);
  std::vector<bf16> v(f.size());
  for (size_t i = 0; i < f.size(); ++i) v[i] = f32_to_bf16(f[i] * 0.05f);
  return v;
}

// n random values that are all bf16 values, as f32 (x) and as bf16 (xh): the tokens of the bf16
// flow, whose jobs carry both. Skips the benchmark if the copy is not exact.
struct Bf16Tokens {
  std::vector<float> x;
  std::vector<bf16> xh;
};
Bf16Tokens random_bf16_tokens(benchmark::State& state, int64_t n, uint32_t seed) {
  Bf16Tokens t{random_f32(n, seed), std::vector<bf16>(static_cast<size_t>(n))};
  for (float& v : t.x) v = round_bf16(v);
  if (!bf16_exact_copy(t.x.data(), n, t.xh.data())) state.SkipWithError("x not bf16-exact");
  return t;
}

std::vector<uint8_t> random_bytes(int64_t n, uint32_t seed, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<uint8_t> v(static_cast<size_t>(n));
  for (uint8_t& b : v) b = static_cast<uint8_t>(d(rng));
  return v;
}

// `count` MXFP4 matrices [N, K] (row-major codes and scales, side by side) in `layout`: kRowMajor
// as a memory-mapped model holds them, or kMxfp4Lanes (util/mxfp4_lanes.h) as the loader stores
// them in private memory, 64-byte aligned as the loader's memory is; job() is matrix m's
// projection of T tokens (bf16 and f32).
struct Mxfp4Pool {
  int64_t N, K;
  Layout layout;
  AlignedBuffer codes, scales;
  std::vector<bool> normal;  // lanes: matrix m's normal_scales
  Mxfp4Pool(const std::vector<uint8_t>& packed, const std::vector<uint8_t>& scale, int64_t n,
            int64_t k, Layout l)
      : N(n),
        K(k),
        layout(l),
        codes(allocate_aligned(packed.size())),
        scales(allocate_aligned(scale.size())) {
    const int64_t pb = N * K / 2, ps = N * K / 32, count = static_cast<int64_t>(packed.size()) / pb;
    auto* c = reinterpret_cast<uint8_t*>(codes.get());
    auto* s = reinterpret_cast<uint8_t*>(scales.get());
    std::memcpy(c, packed.data(), packed.size());
    std::memcpy(s, scale.data(), scale.size());
    if (layout == Layout::kMxfp4Lanes)  // packed in place, as the loader packs what it reads
      for (int64_t m = 0; m < count; ++m) {
        pack_mxfp4_lane_codes_in_place(c + m * pb, N, K);
        pack_mxfp4_lane_scales_in_place(s + m * ps, N, K);
        normal.push_back(mxfp4_scales_normal(s + m * ps, ps));  // as the loader checks them
      }
  }
  MatmulJob job(int64_t m, const float* x, const bf16* xh, int64_t T, float* y) const {
    const auto* c = reinterpret_cast<const uint8_t*>(codes.get());
    const auto* s = reinterpret_cast<const uint8_t*>(scales.get());
    MatmulJob j = mxfp4_job(x, T, c + m * (N * K / 2), s + m * (N * K / 32), N, K, y, layout);
    j.xh = xh;
    j.normal_scales = layout == Layout::kMxfp4Lanes && normal[static_cast<size_t>(m)];
    return j;
  }
};

Layout mxfp4_layout(int64_t arg) {
  return arg != 0 ? Layout::kMxfp4Lanes : Layout::kRowMajor;
}

TensorView bf16_view(const std::vector<bf16>& w, int64_t N, int64_t K, int64_t offset) {
  TensorView v;  // unnamed: setting a name here trips GCC 12's -Wrestrict false positive at -O3
  v.dtype = DType::kBF16;
  v.shape = {N, K};
  v.data = reinterpret_cast<const std::byte*>(w.data() + offset);
  v.nbytes = static_cast<size_t>(N * K) * sizeof(bf16);
  return v;
}

// Copies needed so that cycling through them streams >= 3x the last-level cache.
// At least 4, so that the paired read pass (copy c + copies/2) never touches the copy the next
// kernel call reads, and between a read of copy j and the kernel call on j there are >= 2 LLC
// sizes of other traffic (both stay cold).
int64_t copies_for(int64_t bytes_per_copy) {
  const int64_t target = 3 * static_cast<int64_t>(last_level_cache_bytes());
  return std::max<int64_t>(4, (target + bytes_per_copy - 1) / bytes_per_copy);
}

// Times each call and keeps the fastest: the machine these run on is shared, and the best of
// many calls is the standard (STREAM's own) way to read a limit off a noisy machine. The STREAM
// numbers are best-of too, so the fractions compare like with like. Mean-based rates are
// reported next to them (GB/s, GFLOP/s: wall time, all threads).
class BestOf {
 public:
  template <class F>
  void time(const F& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best_ = std::min(best_, dt);
    total_ += dt;
  }
  double seconds() const { return best_; }
  double total() const { return total_; }

 private:
  double best_ = 1e30;
  double total_ = 0.0;
};

// GB/s counters. `read` (may be null) times stream_read_pass over a different, equally sized
// copy right after each call: of_read_paired = best read time / best kernel time, measured
// under the same machine state (robust to a shared machine's moving load).
void set_bandwidth_counters(benchmark::State& state, int64_t bytes_per_call, const BestOf& b,
                            const BestOf* read) {
  const StreamResult& s = stream_limit();
  const double bytes = static_cast<double>(bytes_per_call);
  const double best_gb_s = bytes / b.seconds() * 1e-9;
  state.counters["stream_read_GB/s"] = s.read_gb_s;
  if (read != nullptr) {
    state.counters["read_best_GB/s"] = bytes / read->seconds() * 1e-9;
    state.counters["of_read_paired"] = read->seconds() / b.seconds();
  }
  state.counters["weight_MiB"] = bytes / kMiB;
  state.counters["GB/s"] = benchmark::Counter(
      bytes * static_cast<double>(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
  state.counters["best_GB/s"] = best_gb_s;
  state.counters["of_stream_read"] = best_gb_s / s.read_gb_s;
  state.counters["of_stream_triad"] = best_gb_s / s.triad_gb_s;
}

// Decode GEMV loop: gemv(c) on weight copy c, then read_copy(o) (a STREAM read pass over another
// copy o of the same bytes), copies in turn; sets the counters above for bytes_per_call.
template <class Gemv, class ReadCopy>
void time_gemv_paired(benchmark::State& state, int64_t copies, int64_t bytes_per_call,
                      const Gemv& gemv, const ReadCopy& read_copy) {
  int64_t c = 0;
  BestOf best, read;
  for (auto _ : state) {
    best.time([&] { gemv(c); });
    const int64_t other = (c + copies / 2) % copies;
    read.time([&] { benchmark::DoNotOptimize(read_copy(other)); });
    c = (c + 1) % copies;
  }
  set_bandwidth_counters(state, bytes_per_call, best, &read);
}

// Run context printed in the benchmark header (registered before main, so only cheap queries
// here; the STREAM numbers are counters of BM_StreamProbe and of every GEMV benchmark).
const bool kContextRegistered = [] {
  benchmark::AddCustomContext("attnres_simd_target", matmul_simd_target());
  benchmark::AddCustomContext("cpu_model", cpu_info().model_name);
  benchmark::AddCustomContext("cpu_features", cpu_features_string(cpu_info()));
  benchmark::AddCustomContext("omp_threads", std::to_string(parallel_threads()));
  benchmark::AddCustomContext("openblas_config", openblas_get_config());
  benchmark::AddCustomContext("openblas_core", openblas_get_corename());
  return true;
}();

// OpenBLAS uses as many threads as the pool (both libraries on all threads).
void context_once() {
  static const bool done = [] {
    openblas_set_num_threads(parallel_threads());
    return true;
  }();
  (void)done;
}

// ---------------------------------------------------------------------------------------------
// GEMV (decode)

// Decode GEMV over bf16 weights [N, K] (args N, K): f32 activations through matmul(), or bf16
// activations through matmul_bf16() (vdpbf16ps where the CPU has AVX512_BF16).
void gemv_bf16_weights(benchmark::State& state, bool bf16_act) {
  context_once();
  const int64_t N = state.range(0), K = state.range(1);
  const int64_t per = N * K, copies = copies_for(per * 2);
  const std::vector<bf16> w = random_bf16(per * copies, 1);  // [copies, N, K]
  const std::vector<float> x = random_f32(K, 2);             // [K]
  const std::vector<bf16> xh = random_bf16(K, 2);            // [K]
  std::vector<float> y(static_cast<size_t>(N));              // [N]
  const auto* bytes = reinterpret_cast<const std::byte*>(w.data());
  time_gemv_paired(
      state, copies, per * 2,
      [&](int64_t c) {
        if (bf16_act) {
          matmul_bf16(xh.data(), 1, bf16_view(w, N, K, c * per), y.data());
        } else {
          matmul(x.data(), 1, bf16_view(w, N, K, c * per), y.data());
        }
        benchmark::DoNotOptimize(y.data());
      },
      [&](int64_t o) { return stream_read_pass(bytes + o * per * 2, per * 2, 0); });
}

void BM_GemvBf16(benchmark::State& state) {
  gemv_bf16_weights(state, false);
}
BENCHMARK(BM_GemvBf16)
    ->ArgNames({"N", "K"})
    ->Args({1024, 1024})
    ->Args({2048, 2048})
    ->Args({8192, 1024})
    ->Args({8192, 2048})
    ->Args({2048, 8192})
    ->Args({4096, 7168})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// args: N, K (MXFP4 expert projections: w1/w3 [512, 1024] and w2 [1024, 512] for K3-mini),
// act: 0 = f32 activations (mxfp4_matmul), 1 = bf16 activations (a batch job with xh: the
// vdpbf16ps kernel the bf16 flow uses where the CPU has AVX512_BF16).
void BM_GemvMxfp4(benchmark::State& state) {
  context_once();
  const int64_t N = state.range(0), K = state.range(1);
  const bool bf16_act = state.range(2) != 0;
  const int64_t pb = N * K / 2, ps = N * K / 32, copies = copies_for(pb + ps);
  const std::vector<uint8_t> packed = random_bytes(pb * copies, 3, 0, 255);   // [copies, N, K/2]
  const std::vector<uint8_t> scale = random_bytes(ps * copies, 4, 118, 124);  // [copies, N, K/32]
  const auto [x, xh] = random_bf16_tokens(state, K, 5);                       // [K]
  std::vector<float> y(static_cast<size_t>(N));                               // [N]
  time_gemv_paired(
      state, copies, pb + ps,
      [&](int64_t c) {
        MatmulJob j =
            mxfp4_job(x.data(), 1, packed.data() + c * pb, scale.data() + c * ps, N, K, y.data());
        if (bf16_act) j.xh = xh.data();
        matmul_batch(&j, 1);
        benchmark::DoNotOptimize(y.data());
      },
      [&](int64_t o) {
        const auto* p = reinterpret_cast<const std::byte*>(packed.data() + o * pb);
        const auto* q = reinterpret_cast<const std::byte*>(scale.data() + o * ps);
        return stream_read_pass(p, pb, 0) + stream_read_pass(q, ps, 0);
      });
}
BENCHMARK(BM_GemvMxfp4)
    ->ArgNames({"N", "K", "bf16_act"})
    ->ArgsProduct({{512}, {1024}, {0, 1}})
    ->ArgsProduct({{1024}, {512}, {0, 1}})
    ->ArgsProduct({{4096}, {2048}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The decode MoE step as the model issues it: one batch of 2 x E_act jobs (w1 and w3 of E_act
// distinct experts chosen at random from a pool spanning >= 3x the last-level cache, so every
// expert comes from DRAM), T = 1, bf16 activations (the bf16 flow). Args: E_act, N, K (k3-mini's
// latent experts are [512, 512] with 8 active; Kimi-K3's are [3072, 3584] with 16). Counters as
// the GEMV benchmarks; of_read_paired pairs each batch with a STREAM read pass over as many
// bytes of other experts (contiguous), mean_GB/s is total bytes / total batch time. hot = 1
// reuses the same experts (cache-resident): the rate the decode arithmetic allows, to compare
// with the cold rate and with a core's share of the read bandwidth. lanes = 1: codes and scales
// in 16-row lane groups, as the loader stores them in private memory; lanes = 0: row-major, as
// a memory-mapped model (--mmap) holds them, each batch followed by the same experts' batch in
// lanes (other copies of the bytes, as cold): lanes_mean_GB/s, and row_major_vs_lanes_mean =
// total lane time / total row-major time, alternated under the same load.
void BM_GemvMxfp4Experts(benchmark::State& state) {
  context_once();
  const int64_t active = state.range(0), N = state.range(1), K = state.range(2);
  const Layout layout = mxfp4_layout(state.range(4));
  const bool alternate = layout == Layout::kRowMajor;
  // hot = 1: the same `active` experts every step, so their weights stay in cache and the rate
  // is what the kernel's arithmetic allows (the read pass then reads cached bytes too).
  const bool hot = state.range(3) != 0;
  const int64_t pb = N * K / 2, ps = N * K / 32, per_expert = 2 * (pb + ps);
  const int64_t pool = hot ? active : std::max<int64_t>(4 * active, copies_for(per_expert));
  const std::vector<uint8_t> packed = random_bytes(2 * pb * pool, 3, 0, 255);  // [pool, 2, N, K/2]
  const std::vector<uint8_t> scale =
      random_bytes(2 * ps * pool, 4, 118, 124);               // [pool, 2, N, K/32]
  const auto [x, xh] = random_bf16_tokens(state, K, 5);       // [K]
  std::vector<float> y(static_cast<size_t>(2 * active * N));  // [2 E_act, N]
  const Mxfp4Pool matrices(packed, scale, N, K, layout);
  // The same experts in lanes, for the alternated batches (row-major runs only).
  std::optional<Mxfp4Pool> lane_matrices;
  if (alternate) lane_matrices.emplace(packed, scale, N, K, Layout::kMxfp4Lanes);
  std::vector<MatmulJob> jobs(static_cast<size_t>(2 * active)),
      lane_jobs(static_cast<size_t>(2 * active));
  std::vector<int64_t> ids(static_cast<size_t>(pool));
  for (int64_t e = 0; e < pool; ++e) ids[static_cast<size_t>(e)] = e;
  std::mt19937 rng(9);
  BestOf best, read, lanes;
  int64_t round = 0;
  for (auto _ : state) {
    std::shuffle(ids.begin(), ids.end(), rng);     // the first `active` are this step's experts
    std::sort(ids.begin(), ids.begin() + active);  // the model runs them in index order
    for (int64_t a = 0; a < active; ++a)
      for (int64_t m = 0; m < 2; ++m) {
        const int64_t e = ids[static_cast<size_t>(a)] * 2 + m;
        float* ye = y.data() + (2 * a + m) * N;
        jobs[static_cast<size_t>(2 * a + m)] = matrices.job(e, x.data(), xh.data(), 1, ye);
        if (alternate)
          lane_jobs[static_cast<size_t>(2 * a + m)] =
              lane_matrices->job(e, x.data(), xh.data(), 1, ye);
      }
    best.time([&] { matmul_batch(jobs.data(), 2 * active); });
    if (alternate) lanes.time([&] { matmul_batch(lane_jobs.data(), 2 * active); });
    benchmark::DoNotOptimize(y.data());
    // Another `active` experts' bytes, contiguous (rarely overlapping this step's experts).
    const int64_t o = round * 7919 % (pool - active + 1);
    read.time([&] {
      const auto* p = reinterpret_cast<const std::byte*>(packed.data() + 2 * o * pb);
      const auto* q = reinterpret_cast<const std::byte*>(scale.data() + 2 * o * ps);
      benchmark::DoNotOptimize(stream_read_pass(p, 2 * active * pb, 0) +
                               stream_read_pass(q, 2 * active * ps, 0));
    });
    ++round;
  }
  set_bandwidth_counters(state, active * per_expert, best, &read);
  const auto mean_gb_s = [&](const BestOf& b) {
    return static_cast<double>(active * per_expert) * static_cast<double>(state.iterations()) /
           b.total() * 1e-9;
  };
  state.counters["mean_GB/s"] = mean_gb_s(best);
  state.counters["read_mean_GB/s"] = mean_gb_s(read);
  if (alternate) {
    state.counters["lanes_mean_GB/s"] = mean_gb_s(lanes);
    state.counters["row_major_vs_lanes_mean"] = lanes.total() / best.total();
  }
}
BENCHMARK(BM_GemvMxfp4Experts)
    ->ArgNames({"E_act", "N", "K", "hot", "lanes"})
    ->ArgsProduct({{8}, {512}, {512}, {0, 1}, {0, 1}})
    ->ArgsProduct({{16}, {3072}, {3584}, {0}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// OpenBLAS sgemv on f32 weights (twice the bytes of bf16), for reference.
void BM_GemvOpenblasF32(benchmark::State& state) {
  context_once();
  const int64_t N = state.range(0), K = state.range(1);
  const int64_t per = N * K, copies = copies_for(per * 4);
  const std::vector<float> w = random_f32(per * copies, 6);  // [copies, N, K]
  const std::vector<float> x = random_f32(K, 7);             // [K]
  std::vector<float> y(static_cast<size_t>(N));              // [N]
  int64_t c = 0;
  BestOf best;
  for (auto _ : state) {
    best.time([&] {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(N), static_cast<int>(K), 1.0f,
                  w.data() + c * per, static_cast<int>(K), x.data(), 1, 0.0f, y.data(), 1);
    });
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % copies;
  }
  set_bandwidth_counters(state, per * 4, best, nullptr);
}
BENCHMARK(BM_GemvOpenblasF32)
    ->ArgNames({"N", "K"})
    ->Args({2048, 2048})
    ->Args({8192, 2048})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// ---------------------------------------------------------------------------------------------
// GEMM (prefill)

void openblas_gemm(const float* x, const float* w, int64_t T, int64_t N, int64_t K, float* y) {
  // y[T, N] = x[T, K] * w[N, K]^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(T), static_cast<int>(N),
              static_cast<int>(K), 1.0f, x, static_cast<int>(K), w, static_cast<int>(K), 0.0f, y,
              static_cast<int>(N));
}

// Side by side: every iteration times one call of ours and then one OpenBLAS sgemm call on the
// same inputs, so both see the same machine state (this machine is shared and its load moves).
// The benchmark's own time is ours (manual time). Counters: mean and best GFLOP/s of each, and
// vs_openblas = best ours / best OpenBLAS, vs_openblas_mean = mean ours / mean OpenBLAS.
template <class Ours>
void gemm_side_by_side(benchmark::State& state, int64_t T, int64_t N, int64_t K, const Ours& ours,
                       const std::vector<float>& x, const std::vector<float>& w32) {
  std::vector<float> y(static_cast<size_t>(T * N));        // [T, N] OpenBLAS output
  openblas_gemm(x.data(), w32.data(), T, N, K, y.data());  // warm-up (thread pool start)
  BestOf best_ours, best_ref;
  double sum_ours = 0.0, sum_ref = 0.0;
  for (auto _ : state) {
    const double before = best_ours.total();
    best_ours.time(ours);
    state.SetIterationTime(best_ours.total() - before);
    best_ref.time([&] { openblas_gemm(x.data(), w32.data(), T, N, K, y.data()); });
    benchmark::DoNotOptimize(y.data());
  }
  sum_ours = best_ours.total();
  sum_ref = best_ref.total();
  const double flops = 2.0 * static_cast<double>(T * N * K);
  const double iters = static_cast<double>(state.iterations());
  state.counters["GFLOP/s"] = flops * iters / sum_ours * 1e-9;
  state.counters["best_GFLOP/s"] = flops / best_ours.seconds() * 1e-9;
  state.counters["openblas_GFLOP/s"] = flops * iters / sum_ref * 1e-9;
  state.counters["openblas_best_GFLOP/s"] = flops / best_ref.seconds() * 1e-9;
  state.counters["vs_openblas"] = best_ref.seconds() / best_ours.seconds();
  state.counters["vs_openblas_mean"] = sum_ref / sum_ours;
}

// args: T, N, K. Ours on bf16 weights vs OpenBLAS sgemm on the same weights widened to f32.
void BM_GemmBf16(benchmark::State& state) {
  context_once();
  const int64_t T = state.range(0), N = state.range(1), K = state.range(2);
  const std::vector<bf16> w = random_bf16(N * K, 8);  // [N, K]
  std::vector<float> w32(w.size());                   // [N, K] widened for OpenBLAS
  for (size_t i = 0; i < w.size(); ++i) w32[i] = bf16_to_f32(w[i]);
  const std::vector<float> x = random_f32(T * K, 9);  // [T, K]
  std::vector<float> y(static_cast<size_t>(T * N));   // [T, N]
  gemm_side_by_side(
      state, T, N, K, [&] { matmul(x.data(), T, bf16_view(w, N, K, 0), y.data()); }, x, w32);
}
BENCHMARK(BM_GemmBf16)
    ->ArgNames({"T", "N", "K"})
    ->Args({64, 2048, 2048})
    ->Args({256, 2048, 1024})
    ->Args({256, 2048, 2048})
    ->Args({256, 8192, 2048})
    ->Args({1024, 2048, 2048})
    ->Args({4096, 1024, 1024})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// args: T, N, K. bf16 activations (matmul_bf16: vdpbf16ps on AVX512_BF16 CPUs) vs OpenBLAS
// sgemm on the same values widened to f32 (OpenBLAS 0.3.21 from Debian has no sbgemm).
void BM_GemmBf16Act(benchmark::State& state) {
  context_once();
  const int64_t T = state.range(0), N = state.range(1), K = state.range(2);
  const std::vector<bf16> w = random_bf16(N * K, 8);  // [N, K]
  std::vector<float> w32(w.size());                   // [N, K] widened for OpenBLAS
  for (size_t i = 0; i < w.size(); ++i) w32[i] = bf16_to_f32(w[i]);
  const std::vector<bf16> xb = random_bf16(T * K, 9);  // [T, K]
  std::vector<float> x32(xb.size());                   // [T, K] widened for OpenBLAS
  for (size_t i = 0; i < xb.size(); ++i) x32[i] = bf16_to_f32(xb[i]);
  std::vector<float> y(static_cast<size_t>(T * N));  // [T, N]
  state.counters["uses_vdpbf16ps"] = matmul_bf16_uses_dot_product() ? 1 : 0;
  gemm_side_by_side(
      state, T, N, K, [&] { matmul_bf16(xb.data(), T, bf16_view(w, N, K, 0), y.data()); }, x32,
      w32);
}
BENCHMARK(BM_GemmBf16Act)
    ->ArgNames({"T", "N", "K"})
    ->Args({256, 1024, 512})  // k3-mini's latent up and shared down projections
    ->Args({64, 2048, 2048})
    ->Args({256, 2048, 1024})
    ->Args({256, 2048, 2048})
    ->Args({256, 8192, 2048})
    ->Args({1024, 2048, 2048})
    ->Args({4096, 1024, 1024})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// args: T, N, K. The same bf16 product over the two weight layouts, alternated call by call:
// row-major (matmul_bf16: vdpbf16ps dot products, a horizontal sum per output) and lane-packed
// (matmul_bf16_lanes: one output row per lane, no horizontal sums). Best of calls against the
// vdpbf16ps peak probed in the same process, and lanes_vs_row_major = best row-major time / best
// lane-packed time.
void BM_GemmBf16Layouts(benchmark::State& state) {
  const int64_t T = state.range(0), N = state.range(1), K = state.range(2);
  const std::vector<bf16> w = random_bf16(N * K, 8);  // [N, K]
  std::vector<bf16> packed(static_cast<size_t>(lanes_size(N, K)));
  pack_bf16_lanes(w.data(), N, K, packed.data());
  const std::vector<bf16> x = random_bf16(T * K, 9);  // [T, K]
  std::vector<float> y(static_cast<size_t>(T * N));   // [T, N]
  BestOf row_major, lanes;
  for (auto _ : state) {
    row_major.time([&] { matmul_bf16(x.data(), T, bf16_view(w, N, K, 0), y.data()); });
    lanes.time([&] { matmul_bf16_lanes(x.data(), T, packed.data(), N, K, 0, N, y.data(), N); });
    benchmark::DoNotOptimize(y.data());
  }
  static const double peak = compute_probe(/*bf16_dot=*/true).gflop_s;
  const double gflop = 2.0 * static_cast<double>(T * N * K) * 1e-9;
  state.counters["dot_peak_GFLOP_s"] = peak;
  state.counters["row_major_of_peak"] = gflop / row_major.seconds() / peak;
  state.counters["lanes_of_peak"] = gflop / lanes.seconds() / peak;
  state.counters["lanes_vs_row_major"] = row_major.seconds() / lanes.seconds();
}
BENCHMARK(BM_GemmBf16Layouts)
    ->ArgNames({"T", "N", "K"})
    ->Args({256, 1024, 1024})  // k3-mini: MLA / KDA projections, shared experts, the head's shape
    ->Args({256, 4096, 1024})
    ->Args({256, 1024, 4096})
    ->Args({256, 2048, 512})
    ->Args({16, 4096, 1024})
    ->Iterations(30)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// args: N, K. Decode (T = 1) over the two layouts from memory: copies of the matrix in each
// layout, in WeightMemory (2 MiB pages, as the model's weights are), cycled so every call reads
// cold weights, the two layouts alternated call by call. Mean and best GB/s of each, against the
// STREAM read probe; lanes_vs_row_major_mean = mean row-major time / mean lane-packed time.
void BM_GemvBf16Layouts(benchmark::State& state) {
  const int64_t N = state.range(0), K = state.range(1), per = N * K, pper = lanes_size(N, K);
  const int64_t copies = copies_for(per * 2);
  const std::vector<bf16> w = random_bf16(per, 1);  // [N, K]
  WeightMemory memory;
  auto* rows = reinterpret_cast<bf16*>(memory.allocate(static_cast<size_t>(per * copies) * 2));
  auto* packed = reinterpret_cast<bf16*>(memory.allocate(static_cast<size_t>(pper * copies) * 2));
  for (int64_t c = 0; c < copies; ++c) {
    std::copy(w.begin(), w.end(), rows + c * per);
    pack_bf16_lanes(w.data(), N, K, packed + c * pper);
  }
  TensorView view = bf16_view(w, N, K, 0);
  const std::vector<bf16> x = random_bf16(K, 2);  // [K]
  std::vector<float> y(static_cast<size_t>(N));   // [N]
  BestOf row_major, lanes;
  int64_t c = 0;
  for (auto _ : state) {
    const int64_t other = (c + copies / 2) % copies;
    view.data = reinterpret_cast<const std::byte*>(rows + c * per);
    row_major.time([&] { matmul_bf16(x.data(), 1, view, y.data()); });
    lanes.time(
        [&] { matmul_bf16_lanes(x.data(), 1, packed + other * pper, N, K, 0, N, y.data(), N); });
    benchmark::DoNotOptimize(y.data());
    c = (c + 1) % copies;
  }
  const double bytes = static_cast<double>(per * 2),
               calls = static_cast<double>(state.iterations());
  const double read = stream_limit().read_gb_s;
  state.counters["stream_read_GB/s"] = read;
  state.counters["row_major_mean_GB/s"] = bytes * calls / row_major.total() * 1e-9;
  state.counters["lanes_mean_GB/s"] = bytes * calls / lanes.total() * 1e-9;
  state.counters["row_major_best_GB/s"] = bytes / row_major.seconds() * 1e-9;
  state.counters["lanes_best_GB/s"] = bytes / lanes.seconds() * 1e-9;
  state.counters["lanes_vs_row_major_mean"] = row_major.total() / lanes.total();
}
BENCHMARK(BM_GemvBf16Layouts)
    ->ArgNames({"N", "K"})
    ->Args({1024, 1024})
    ->Args({1536, 1024})
    ->Args({4096, 1024})
    ->Args({8192, 1024})
    ->Args({1024, 4096})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// args: N, K. Decode GEMV with a bf16 activation vector (same weight bytes as BM_GemvBf16).
void BM_GemvBf16Act(benchmark::State& state) {
  gemv_bf16_weights(state, true);
}
BENCHMARK(BM_GemvBf16Act)
    ->ArgNames({"N", "K"})
    ->Args({1024, 1024})
    ->Args({8192, 1024})
    ->Args({2048, 2048})
    ->Args({8192, 2048})
    ->Args({4096, 7168})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// args: T, N, K. MXFP4 expert GEMM (tokens routed to one expert during prefill) straight from
// the packed weights vs OpenBLAS sgemm on the weights dequantised to f32 (same values).
void BM_GemmMxfp4(benchmark::State& state) {
  context_once();
  const int64_t T = state.range(0), N = state.range(1), K = state.range(2);
  const std::vector<uint8_t> packed = random_bytes(N * K / 2, 10, 0, 255);    // [N, K/2]
  const std::vector<uint8_t> scale = random_bytes(N * K / 32, 11, 118, 124);  // [N, K/32]
  std::vector<float> w32(static_cast<size_t>(N * K));                         // [N, K]
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      w32[n * K + k] = mxfp4_get(packed.data() + n * K / 2, scale.data() + n * K / 32, k);
  const std::vector<float> x = random_f32(T * K, 12);  // [T, K]
  std::vector<float> y(static_cast<size_t>(T * N));    // [T, N]
  gemm_side_by_side(
      state, T, N, K,
      [&] { mxfp4_matmul(x.data(), T, packed.data(), scale.data(), N, K, y.data()); }, x, w32);
}
BENCHMARK(BM_GemmMxfp4)
    ->ArgNames({"T", "N", "K"})
    ->Args({32, 512, 1024})
    ->Args({128, 512, 1024})
    ->Args({128, 1024, 512})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// args: E (experts in the batch), T (tokens routed to each), N, K, routed. The MoE prefill batch
// on bf16 tokens: E MXFP4 experts [N, K] (cold: a pool of distinct experts, so their weights come
// from memory as in a prefill over every layer), T tokens each, in one matmul_batch. With
// routed = 1, T is the mean: the E * T (token, expert) pairs fall on the experts uniformly at
// random (seeded), so the experts get the spread of counts a prefill chunk routes to them (for
// k3-mini's 256 tokens, top-8 of 256 experts: mostly 3-16 tokens). Reported against the
// vdpbf16ps peak probed in the same process (compute_probe, as `attnres bench` does). lanes = 1:
// codes and scales in 16-row lane groups, as loaded into private memory; lanes = 0: row-major,
// as memory-mapped.
void BM_GemmMxfp4ExpertsBf16Act(benchmark::State& state) {
  context_once();
  const int64_t E = state.range(0), T = state.range(1), N = state.range(2), K = state.range(3);
  const bool routed = state.range(4) != 0;
  std::vector<int64_t> count(static_cast<size_t>(E), T);
  if (routed) {
    std::fill(count.begin(), count.end(), 0);
    std::mt19937 rng(16);
    std::uniform_int_distribution<int64_t> pick(0, E - 1);
    for (int64_t i = 0; i < E * T; ++i) ++count[static_cast<size_t>(pick(rng))];
  }
  const int64_t pb = N * K / 2, ps = N * K / 32;
  const int64_t pool = std::max<int64_t>(E, copies_for(E * (pb + ps)) * E);
  const std::vector<uint8_t> packed = random_bytes(pb * pool, 13, 0, 255);   // [pool, N, K/2]
  const std::vector<uint8_t> scale = random_bytes(ps * pool, 14, 118, 124);  // [pool, N, K/32]
  const auto [x, xh] = random_bf16_tokens(state, E * T * K, 15);             // [E * T, K]
  std::vector<float> y(static_cast<size_t>(E * T * N));                      // [E * T, N]
  const Mxfp4Pool matrices(packed, scale, N, K, mxfp4_layout(state.range(5)));
  std::vector<MatmulJob> jobs;
  int64_t round = 0;
  BestOf best;
  for (auto _ : state) {
    const int64_t e0 = (round++ * E) % (pool - E + 1);  // another E experts each call
    jobs.clear();
    int64_t row = 0;  // first token row of expert e
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = count[static_cast<size_t>(e)];
      if (n == 0) continue;
      jobs.push_back(
          matrices.job(e0 + e, x.data() + row * K, xh.data() + row * K, n, y.data() + row * N));
      row += n;
    }
    best.time([&] { matmul_batch(jobs.data(), static_cast<int64_t>(jobs.size())); });
    benchmark::DoNotOptimize(y.data());
  }
  static const double peak = compute_probe(/*bf16_dot=*/true).gflop_s;
  const double gflop = 2.0 * static_cast<double>(E * T * N * K) * 1e-9;
  state.counters["best_GFLOP_s"] = gflop / best.seconds();
  state.counters["dot_peak_GFLOP_s"] = peak;
  state.counters["best_of_peak"] = gflop / best.seconds() / peak;
}
BENCHMARK(BM_GemmMxfp4ExpertsBf16Act)
    ->ArgNames({"E", "T", "N", "K", "routed", "lanes"})
    ->ArgsProduct({{64}, {2, 4, 5, 6, 7, 8, 12, 16, 24, 32, 64}, {512}, {1024}, {0}, {1}})
    ->ArgsProduct({{256}, {8, 16}, {512}, {512}, {0}, {0, 1}})
    // k3-mini's routed experts for a 256-token prefill chunk
    ->ArgsProduct({{256}, {8}, {512}, {512}, {1}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// args: T, K, lanes, f32. One MXFP4 expert [512, K] in cache, T tokens, on one thread: the
// expert kernels' own arithmetic with memory out of the way (lanes = 1: in 16-row lane groups, as
// loaded; lanes = 0: row-major, as memory-mapped, packed into lanes on each call; f32 = 1: the
// tokens in f32, as the f32 flow (--dtype f32) gives them, else in bf16). Reported against the
// vdpbf16ps peak of one thread probed in the same process (for f32 tokens the FMA peak is half
// of it on AVX-512 hosts).
void BM_Mxfp4ExpertInCache(benchmark::State& state) {
  context_once();
  const int64_t T = state.range(0), N = 512, K = state.range(1);
  const std::vector<uint8_t> packed = random_bytes(N * K / 2, 17, 0, 255);    // [N, K/2]
  const std::vector<uint8_t> scale = random_bytes(N * K / 32, 18, 118, 124);  // [N, K/32]
  const Mxfp4Pool matrix(packed, scale, N, K, mxfp4_layout(state.range(2)));
  const auto [x, xh] = random_bf16_tokens(state, T * K, 19);  // [T, K]
  std::vector<float> y(static_cast<size_t>(T * N));           // [T, N]
  const bool f32_tokens = state.range(3) != 0;
  const MatmulJob j = matrix.job(0, x.data(), f32_tokens ? nullptr : xh.data(), T, y.data());
  const auto product = [&] { matmul_batch(&j, 1); };
  const int saved = parallel_threads();
  set_parallel_threads(1);
  static const double peak = compute_probe(/*bf16_dot=*/true).gflop_s;  // one thread
  // One product first, so the expert's weights are in cache.
  product();
  BestOf best;
  for (auto _ : state) {
    best.time(product);
    benchmark::DoNotOptimize(y.data());
  }
  set_parallel_threads(saved);
  const double gflop = 2.0 * static_cast<double>(T * N * K) * 1e-9;
  state.counters["best_GFLOP_s"] = gflop / best.seconds();
  state.counters["thread_peak_GFLOP_s"] = peak;
  state.counters["best_of_peak"] = gflop / best.seconds() / peak;
}
BENCHMARK(BM_Mxfp4ExpertInCache)
    ->ArgNames({"T", "K", "lanes", "f32"})
    ->ArgsProduct({{1, 4, 5, 7, 8, 9, 10, 11, 12, 16}, {512, 1024}, {1}, {0}})
    ->ArgsProduct({{1, 8}, {512, 1024}, {0}, {0}})
    ->ArgsProduct({{1, 2, 3, 4, 8}, {512}, {1}, {1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace attnres::bench
