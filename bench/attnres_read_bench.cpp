// The fused AttnRes step (delayed add + read over S sources + RMSNorm, kernels/attnres.h) at the
// published width d = 7168, bf16 storage, against this machine's memory bandwidth.
//
// Bytes per call count what the step must move at minimum: S - 1 committed slots, the running
// sum and the pending output read, the new running sum and the normalised output written
// (T x d bf16 each), plus the slots' inverse RMS ([T] f32 each). Write-allocate reads are not
// counted (a kernel that pays them is slower, not credited).
//
// Args: S (sources: S - 1 slots + the running sum), T (tokens), inplace (1: the planned storage
// policy, rs_out = rs_in and out = pending; 0: both outputs in storage of their own).
// Each iteration times, back to back and so under the same machine state (the machine is
// shared): the step on one of `copies` data sets (rotated so that the data of one call is not in
// the 32 MiB L3 at the next), then a STREAM read pass (kernels/stream_probe.h) over a buffer of
// the same byte count (a window of a larger buffer, rotated likewise), then a STREAM triad (a = b +
// s c, f64, counted as 3 arrays by the STREAM convention) over three arrays of a third of the byte
// count each. Counters:
//   GB_s             bytes / mean step time
//   of_read_paired   mean read-pass time / mean step time (same bytes): the fraction of the
//                    STREAM read bandwidth the step reaches; of_triad_paired likewise for triad
//   best_GB_s, of_read_best  the same from the fastest step and the fastest read pass (load
//                    from other processes only slows a pass down, so best-of is the steadiest)
//   of_read_cpu      the same as of_read_paired from process CPU time instead of wall time:
//                    a thread descheduled by other processes does not count, so it is the
//                    steadiest on a loaded machine (a thread spinning at the end-of-region
//                    barrier still counts, in both the step and the read pass)
//   frac_read/triad  GB_s / the process-wide STREAM probe (bench_limits.h), measured once
//   ./attnres_bench --benchmark_filter=AttnRes --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
// Measured 2026-11-30 (AVX3 with AVX512_BF16, medians of 3 repetitions, binaries before and
// after the hardware bf16 casts of kernels/attnres_hwy.cpp alternated 2-5 times, T = 4096, in
// place; another engineer's benchmarks shared the 2 cores, load average 0.2-2.9):
//   2 threads, S = 9, load < 1.4: of_read_paired 0.78-0.84 -> 0.81-0.86 (28-29 GB/s both; at
//   load > 2 either kernel gives 0.65-0.77 at 13-14 GB/s, a thread descheduled).
//   1 thread: S = 9 0.58-0.66 -> 0.58-0.62 (14.1-14.9 -> 14.4-15.3 GB/s); S = 5 15.6-16.4 ->
//   15.6-16.8 GB/s; S = 2 13.1-14.4 -> 15.0-16.1 GB/s.
// With its rows in L2 one thread went from 21.8 to 23.6 GB/s at S = 9 (16.3 to 21.3 at S = 2),
// but at DRAM it stays near 15 GB/s (memory access, not the casts, bounds it now; prefetch 3 or
// 4 rows ahead and other locality hints measured no better). The issue-5 target (>= 0.85 at
// S = 9) is not reliably met: one run of four above it, on a quiet machine. T = 256 calls (1-2 ms)
// were mostly stretched by scheduler slices. Details: docs/performance.md, "The fused AttnRes
// step".
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <ctime>
#include <vector>

#include "bench_limits.h"
#include "kernels/attnres.h"
#include "util/parallel.h"
#include "util/random.h"

namespace attnres::bench {
namespace {

constexpr int64_t kDim = 7168;

// Process CPU time (all threads), seconds.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Wall seconds of fn(); adds its process CPU seconds to *cpu.
double seconds_of(const auto& fn, double* cpu = nullptr) {
  const double c0 = cpu != nullptr ? cpu_seconds() : 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (cpu != nullptr) *cpu += cpu_seconds() - c0;
  return wall;
}

// One data set of the step: S - 1 slots, the running sum and the pending output (and, when not
// in place, the two output buffers). Outputs are written over inputs in place, so the values
// drift from call to call; they stay finite (the running sum grows by a normalised row a call).
struct StepData {
  std::vector<std::vector<bf16>> slots;  // [S-1][T, d]
  std::vector<std::vector<float>> inv;   // [S-1][T]
  std::vector<bf16> rs, pending;         // [T, d]
  std::vector<bf16> rs_out, out;         // [T, d], only when not in place
  std::vector<const bf16*> slot_ptrs;
  std::vector<const float*> inv_ptrs;
  AttnResStepArgs<bf16> args;
};

void make_step_data(StepData& s, int S, int64_t T, bool inplace, const std::vector<float>& query,
                    const std::vector<float>& gain, uint64_t seed) {
  const size_t n = static_cast<size_t>(T * kDim);
  SplitMix64 rng{seed};
  auto fill = [&](std::vector<bf16>& v) {
    v.resize(n);
    for (bf16& x : v) x = f32_to_bf16(rng.uniform(-1.0f, 1.0f));
  };
  s.slots.resize(static_cast<size_t>(S - 1));
  s.inv.assign(static_cast<size_t>(S - 1), std::vector<float>(static_cast<size_t>(T), 1.0f));
  for (auto& v : s.slots) fill(v);
  fill(s.rs);
  fill(s.pending);
  if (!inplace) {
    s.rs_out.assign(n, bf16{});
    s.out.assign(n, bf16{});
  }
  for (size_t i = 0; i < s.slots.size(); ++i) {
    s.slot_ptrs.push_back(s.slots[i].data());
    s.inv_ptrs.push_back(s.inv[i].data());
  }
  AttnResStepArgs<bf16>& a = s.args;
  a.tokens = T;
  a.dim = kDim;
  a.res_eps = 1e-5f;
  a.norm_eps = 1e-5f;
  a.num_slots = S - 1;
  a.slots = s.slot_ptrs.data();
  a.slot_inv_rms = s.inv_ptrs.data();
  a.rs_in = s.rs.data();
  a.pending = s.pending.data();
  a.rs_out = inplace ? s.rs.data() : s.rs_out.data();  // planned policy: in place
  a.query = query.data();
  a.norm_weight = gain.data();
  a.out = inplace ? s.pending.data() : s.out.data();  // planned: over the consumed pending
}

void stream_triad(double* a, const double* b, const double* c, int64_t n) {
  parallel_ranges(n, true, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) a[i] = b[i] + 3.0 * c[i];
  });
}

void BM_AttnResStep(benchmark::State& state) {
  const int S = static_cast<int>(state.range(0));
  const int64_t T = state.range(1);
  const bool inplace = state.range(2) != 0;
  const double arrays_read = S + 1, arrays_written = 2;
  const double array_bytes = static_cast<double>(T * kDim) * 2.0;
  const double bytes = (arrays_read + arrays_written) * array_bytes +
                       static_cast<double>(S - 1) * static_cast<double>(T) * 4.0;
  // Enough data sets that consecutive calls touch at least 2x the last-level cache.
  const double footprint = (S + 1 + (inplace ? 0 : 2)) * array_bytes;
  const int copies = std::max(
      1, static_cast<int>(2.0 * static_cast<double>(last_level_cache_bytes()) / footprint) + 1);
  SplitMix64 rng{42};
  std::vector<float> query(static_cast<size_t>(kDim)), gain(static_cast<size_t>(kDim), 1.0f);
  for (float& q : query) q = rng.uniform(-0.05f, 0.05f);
  std::vector<StepData> data(static_cast<size_t>(copies));
  for (int c = 0; c < copies; ++c) {
    make_step_data(data[static_cast<size_t>(c)], S, T, inplace, query, gain, 100 + c);
  }
  // Paired STREAM buffers: windows of `bytes` to read, and three arrays of bytes / 3 for the
  // triad, `windows` of each, so that a window was last touched at least 2x the last-level
  // cache earlier (a read of 18-44 MB at T = 256 would otherwise partly hit the 32 MiB L3).
  const size_t read_words = static_cast<size_t>(bytes) / 8;
  const int64_t triad_n = static_cast<int64_t>(bytes / 3.0 / 8.0);
  const int windows = std::max(
      2, static_cast<int>(2.0 * static_cast<double>(last_level_cache_bytes()) / bytes) + 2);
  std::vector<uint64_t> read_buf(read_words * static_cast<size_t>(windows),
                                 0x3ff0000000000000ull);  // [windows, read_words]
  std::vector<double> ta(static_cast<size_t>(triad_n * windows), 0.0), tb(ta.size(), 1.0),
      tc(ta.size(), 2.0);  // [windows, triad_n] each

  double t_step = 0.0, t_read = 0.0, t_triad = 0.0;
  double best_step = 1e30, best_read = 1e30;
  double cpu_step = 0.0, cpu_read = 0.0;
  int c = 0, w = 0;
  for (auto _ : state) {
    const AttnResStepArgs<bf16>& a = data[static_cast<size_t>(c)].args;
    const double ts = seconds_of([&] { attnres_step(a); }, &cpu_step);
    state.SetIterationTime(ts);
    t_step += ts;
    best_step = std::min(best_step, ts);
    benchmark::ClobberMemory();
    const double tr = seconds_of(
        [&] {
          benchmark::DoNotOptimize(
              stream_read_pass(reinterpret_cast<const std::byte*>(read_buf.data() + w * read_words),
                               read_words * 8, 0));
        },
        &cpu_read);
    t_read += tr;
    best_read = std::min(best_read, tr);
    const int64_t o = w * triad_n;
    t_triad +=
        seconds_of([&] { stream_triad(ta.data() + o, tb.data() + o, tc.data() + o, triad_n); });
    benchmark::ClobberMemory();
    c = (c + 1) % copies;
    w = (w + 1) % windows;
  }
  const double iters = static_cast<double>(state.iterations());
  const double gb_s = bytes * iters / t_step * 1e-9;
  const StreamResult& lim = stream_limit();
  state.counters["GB_s"] = gb_s;
  state.counters["read_GB_s"] = static_cast<double>(read_words * 8) * iters / t_read * 1e-9;
  state.counters["triad_GB_s"] = 3.0 * static_cast<double>(triad_n) * 8.0 * iters / t_triad * 1e-9;
  state.counters["of_read_paired"] =
      (t_read / static_cast<double>(read_words * 8)) / (t_step / bytes);
  state.counters["of_triad_paired"] =
      (t_triad / (3.0 * static_cast<double>(triad_n) * 8.0)) / (t_step / bytes);
  state.counters["of_read_cpu"] =
      (cpu_read / static_cast<double>(read_words * 8)) / (cpu_step / bytes);
  state.counters["best_GB_s"] = bytes / best_step * 1e-9;
  state.counters["of_read_best"] =
      (best_read / static_cast<double>(read_words * 8)) / (best_step / bytes);
  state.counters["stream_read_GB_s"] = lim.read_gb_s;
  state.counters["frac_read"] = gb_s / lim.read_gb_s;
  state.counters["frac_triad"] = gb_s / lim.triad_gb_s;
  state.counters["copies"] = copies;
  state.SetLabel(attnres_target_name());
}

BENCHMARK(BM_AttnResStep)
    ->ArgNames({"S", "T", "inplace"})
    ->Args({9, 4096, 1})
    ->Args({5, 4096, 1})
    ->Args({2, 4096, 1})
    ->Args({9, 256, 1})
    ->Args({5, 256, 1})
    ->Args({2, 256, 1})
    ->Args({9, 4096, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

}  // namespace
}  // namespace attnres::bench
