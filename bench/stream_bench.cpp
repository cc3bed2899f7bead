// STREAM probe as a benchmark: reports copy/triad/read GB/s on arrays of 4x the last-level
// cache with all of the pool's threads, and defines bench::stream_limit() for the other benchmarks.
//   ./attnres_bench --benchmark_filter=Stream
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>

#include "bench_limits.h"

namespace attnres::bench {

const StreamResult& stream_limit() {
  static const StreamResult limit = [] {
    StreamOptions o;
    o.reps = 10;
    Result<StreamResult> r = stream_probe(o);
    if (!r.is_ok()) {
      std::fprintf(stderr, "stream probe failed: %s\n", r.status().to_string().c_str());
      std::abort();
    }
    return *r;
  }();
  return limit;
}

namespace {

void BM_StreamProbe(benchmark::State& state) {
  StreamResult r;
  for (auto _ : state) {
    StreamOptions o;
    o.reps = 5;
    Result<StreamResult> res = stream_probe(o);
    if (!res.is_ok()) {
      state.SkipWithError(res.status().to_string().c_str());
      return;
    }
    r = *res;
  }
  state.counters["copy_GB/s"] = r.copy_gb_s;
  state.counters["triad_GB/s"] = r.triad_gb_s;
  state.counters["read_GB/s"] = r.read_gb_s;
  state.counters["array_MiB"] = static_cast<double>(r.array_bytes) / (1 << 20);
  state.counters["threads"] = r.threads;
}
BENCHMARK(BM_StreamProbe)->Iterations(3)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace attnres::bench
