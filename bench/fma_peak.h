// Measured FMA throughput of this machine (the compute limit the prefill benchmarks of KDA and
// MLA are held to): defined in bench/kda_bench.cpp, measured once per process.
#pragma once

#include <benchmark/benchmark.h>

#include "kernels/matmul.h"

namespace attnres::bench {

// Best-of-5 f32 GFLOP/s (an FMA counts 2 FLOPs) of independent fused multiply-adds on the
// widest Highway target this CPU supports (the one the kernels are dispatched to), all of the
// pool's threads. Abort-free: it cannot fail.
double fma_peak_gflop_s();

// Counters of a compute-bound kernel doing `gflop` per call: GFLOP_s, the probe's peak and
// frac_fma_peak = GFLOP_s / peak.
inline void set_flop_counters(benchmark::State& state, double gflop) {
  const double peak = fma_peak_gflop_s();
  state.counters["GFLOP_s"] =
      benchmark::Counter(gflop, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["fma_peak_GFLOP_s"] = peak;
  state.counters["frac_fma_peak"] =
      benchmark::Counter(gflop / peak, benchmark::Counter::kIsIterationInvariantRate);
}

// Benchmark label: the scalar twin or the SIMD target the fast kernel is dispatched to.
inline const char* impl_label(bool ref) {
  return ref ? "ref (scalar twin)" : matmul_simd_target();
}

}  // namespace attnres::bench
