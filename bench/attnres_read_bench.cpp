// The fused AttnRes step (delayed add + read over S sources + RMSNorm, kernels/attnres.h) at the
// published width d = 7168, bf16 storage, against this machine's STREAM bandwidth. Bytes per
// call count what the step must move: S - 1 committed slots, the running sum and the pending
// output read, the new running sum and the normalised output written (T x d bf16 each; the
// per-slot inverse RMS [T] f32 is included). GB/s = bytes / time; frac_* = GB/s / STREAM.
//   ./attnres_bench --benchmark_filter=AttnRes
#include <benchmark/benchmark.h>

#include <vector>

#include "bench_limits.h"
#include "kernels/attnres.h"
#include "util/random.h"

namespace attnres::bench {
namespace {

void BM_AttnResStep(benchmark::State& state) {
  const int S = static_cast<int>(state.range(0));  // sources: S - 1 slots + the running sum
  const int64_t T = state.range(1), d = 7168;
  const size_t n = static_cast<size_t>(T * d);
  SplitMix64 rng{42};
  auto fill = [&](std::vector<bf16>& v) {
    v.resize(n);
    for (bf16& x : v) x = f32_to_bf16(rng.uniform(-1.0f, 1.0f));
  };
  std::vector<std::vector<bf16>> slots(static_cast<size_t>(S - 1));
  std::vector<std::vector<float>> inv(static_cast<size_t>(S - 1),
                                      std::vector<float>(static_cast<size_t>(T), 1.0f));
  for (auto& s : slots) fill(s);
  std::vector<bf16> rs, pending;
  fill(rs);
  fill(pending);
  std::vector<float> query(static_cast<size_t>(d)), gain(static_cast<size_t>(d), 1.0f);
  for (float& q : query) q = rng.uniform(-0.05f, 0.05f);
  std::vector<const bf16*> slot_ptrs;
  std::vector<const float*> inv_ptrs;
  for (size_t i = 0; i < slots.size(); ++i) {
    slot_ptrs.push_back(slots[i].data());
    inv_ptrs.push_back(inv[i].data());
  }
  AttnResStepArgs<bf16> a;
  a.tokens = T;
  a.dim = d;
  a.res_eps = 1e-5f;
  a.norm_eps = 1e-5f;
  a.num_slots = S - 1;
  a.slots = slot_ptrs.data();
  a.slot_inv_rms = inv_ptrs.data();
  a.rs_in = rs.data();
  a.pending = pending.data();
  a.rs_out = rs.data();  // in place, as the planned policy does
  a.query = query.data();
  a.norm_weight = gain.data();
  a.out = pending.data();  // the mixture overwrites the consumed pending output
  for (auto _ : state) {
    attnres_step(a);
    benchmark::ClobberMemory();
  }
  const double bytes = static_cast<double>(S - 1 + 4) * static_cast<double>(n) * 2.0 +
                       static_cast<double>(S - 1) * static_cast<double>(T) * 4.0;
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
  const StreamResult& lim = stream_limit();
  state.counters["GB_s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["stream_read_GB_s"] = lim.read_gb_s;
  state.counters["stream_triad_GB_s"] = lim.triad_gb_s;
  state.counters["frac_read"] = benchmark::Counter(bytes * 1e-9 / lim.read_gb_s,
                                                   benchmark::Counter::kIsIterationInvariantRate);
  state.counters["frac_triad"] = benchmark::Counter(bytes * 1e-9 / lim.triad_gb_s,
                                                    benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(attnres_target_name());
}

BENCHMARK(BM_AttnResStep)
    ->Args({9, 4096})
    ->Args({5, 4096})
    ->Args({2, 4096})
    ->Args({9, 256})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace attnres::bench
