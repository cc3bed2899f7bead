// STREAM-style bandwidth probe (see stream_probe.h for the contract).
//
// The kernels are idempotent so every pass does the same work and the final contents have a
// closed form: a = 1 (read-only), copy c = a (-> 1), triad b = a + 3 c (-> 4), read sum(b)
// (-> 4 n, exact in f64 for any n that fits in memory).
#include "kernels/stream_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <string>

#include "util/cpu.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace attnres {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

size_t last_level_cache_bytes() {
  const size_t llc = cpu_info().llc_bytes;
  return llc != 0 ? llc : size_t{32} << 20;
}

Result<StreamResult> stream_probe(const StreamOptions& options) {
  if (options.reps < 1)
    return Status(ErrorCode::kInvalidArgument,
                  "stream_probe: reps: expected >= 1, found " + std::to_string(options.reps));
  size_t bytes = options.array_bytes;
  if (bytes == 0) bytes = std::max(4 * last_level_cache_bytes(), size_t{64} << 20);
  if (bytes < 1024)
    return Status(ErrorCode::kInvalidArgument,
                  "stream_probe: array_bytes: expected >= 1024, found " + std::to_string(bytes));
  int threads = options.threads;
#ifdef _OPENMP
  if (threads <= 0) threads = omp_get_max_threads();
#else
  threads = 1;
#endif
  const int64_t n = static_cast<int64_t>(bytes / sizeof(double));
  // Uninitialised on purpose: the first touch below places pages near the threads using them.
  std::unique_ptr<double[]> a(new (std::nothrow) double[n]);  // [n]
  std::unique_ptr<double[]> b(new (std::nothrow) double[n]);  // [n]
  std::unique_ptr<double[]> c(new (std::nothrow) double[n]);  // [n]
  if (!a || !b || !c)
    return Status(ErrorCode::kInternal,
                  "stream_probe: cannot allocate 3 arrays of " + std::to_string(bytes) + " bytes");
  double* pa = a.get();
  double* pb = b.get();
  double* pc = c.get();
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) {
    pa[i] = 1.0;
    pb[i] = 0.0;
    pc[i] = 0.0;
  }

  const double array = static_cast<double>(n) * sizeof(double);
  double best_copy = 1e30, best_triad = 1e30, best_read = 1e30;
  double sum = 0.0;
  const double s = 3.0;
  // One untimed warm-up pass (page faults, frequency ramp), then `reps` timed passes.
  for (int rep = 0; rep <= options.reps; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) pc[i] = pa[i];
    const double t_copy = seconds_since(t0);

    t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; ++i) pb[i] = pa[i] + s * pc[i];
    const double t_triad = seconds_since(t0);

    t0 = std::chrono::steady_clock::now();
    double acc = 0.0;
    // Eight independent partial sums per thread so the add latency does not cap a core's read
    // rate below its memory bandwidth (one dependent chain reads ~16 B per add latency). The
    // sum's order is irrelevant: every term is 4.0 and all partial sums are exact.
#pragma omp parallel num_threads(threads) reduction(+ : acc)
    {
      int64_t begin = 0, end = n;
#ifdef _OPENMP
      const int64_t nt = omp_get_num_threads(), id = omp_get_thread_num();
      begin = n * id / nt;
      end = n * (id + 1) / nt;
#endif
      double p0 = 0, p1 = 0, p2 = 0, p3 = 0, p4 = 0, p5 = 0, p6 = 0, p7 = 0;
      int64_t i = begin;
      for (; i + 8 <= end; i += 8) {
        p0 += pb[i];
        p1 += pb[i + 1];
        p2 += pb[i + 2];
        p3 += pb[i + 3];
        p4 += pb[i + 4];
        p5 += pb[i + 5];
        p6 += pb[i + 6];
        p7 += pb[i + 7];
      }
      for (; i < end; ++i) p0 += pb[i];
      acc += ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7));
    }
    const double t_read = seconds_since(t0);
    sum = acc;
    if (rep == 0) continue;
    best_copy = std::min(best_copy, t_copy);
    best_triad = std::min(best_triad, t_triad);
    best_read = std::min(best_read, t_read);
  }

  int64_t bad = 0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(+ : bad)
  for (int64_t i = 0; i < n; ++i) bad += (pa[i] != 1.0) + (pc[i] != 1.0) + (pb[i] != 4.0);
  if (bad != 0 || sum != 4.0 * static_cast<double>(n))
    return Status(ErrorCode::kInternal,
                  "stream_probe: result check: expected a=1, c=1, b=4 and sum=" +
                      std::to_string(4.0 * static_cast<double>(n)) + ", found " +
                      std::to_string(bad) + " wrong elements and sum=" + std::to_string(sum));

  StreamResult r;
  r.copy_gb_s = 2.0 * array / best_copy * 1e-9;
  r.triad_gb_s = 3.0 * array / best_triad * 1e-9;
  r.read_gb_s = 1.0 * array / best_read * 1e-9;
  r.array_bytes = static_cast<size_t>(n) * sizeof(double);
  r.threads = threads;
  r.reps = options.reps;
  return r;
}

}  // namespace attnres
