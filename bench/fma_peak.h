// Measured FMA throughput of this machine (the compute limit the prefill benchmarks of KDA and
// MLA are held to): defined in bench/kda_bench.cpp, measured once per process.
#pragma once

namespace attnres::bench {

// Best-of-5 f32 GFLOP/s (an FMA counts 2 FLOPs) of independent fused multiply-adds on the
// widest Highway target this CPU supports (the one the kernels are dispatched to), all OpenMP
// threads. Abort-free: it cannot fail.
double fma_peak_gflop_s();

}  // namespace attnres::bench
