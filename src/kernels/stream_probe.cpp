// STREAM-style bandwidth probe (see stream_probe.h for the contract).
//
// The kernels are idempotent so every pass does the same work and the final contents have a
// closed form: a = 1 (read-only), copy c = a (-> 1), triad b = a + 3 c (-> 4), read: the sum
// of b's 64-bit words mod 2^64 (-> n times the bits of 4.0).
#include "kernels/stream_probe.h"

#include <atomic>

#include "util/parallel.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "util/cpu.h"

namespace attnres {
namespace {

// fn(begin, end) on `parts` contiguous parts of [0, n), one task each.
template <typename Fn>
void split(int64_t n, int parts, const Fn& fn) {
  parallel_tasks(parts, [&](int64_t i) { fn(n * i / parts, n * (i + 1) / parts); });
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

uint64_t stream_read_pass(const std::byte* data, size_t bytes, int threads) {
  if (threads <= 0) threads = parallel_threads();
  const int64_t n = static_cast<int64_t>(bytes / sizeof(uint64_t));
  std::atomic<uint64_t> acc{0};
  // Integer adds (no floating-point assists on arbitrary bit patterns), eight independent
  // partial sums per thread so add latency never caps a core's read rate; one contiguous part
  // per thread.
  split(n, threads, [&](int64_t begin, int64_t end) {
    uint64_t p[8] = {};
    int64_t i = begin;
    for (; i + 8 <= end; i += 8) {
      uint64_t w[8];
      std::memcpy(w, data + i * 8, sizeof(w));  // unaligned-safe 64-byte load
      for (int j = 0; j < 8; ++j) p[j] += w[j];
    }
    for (; i < end; ++i) {
      uint64_t w;
      std::memcpy(&w, data + i * 8, sizeof(w));
      p[0] += w;
    }
    acc += ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
  });
  uint64_t total = acc.load();
  for (size_t i = static_cast<size_t>(n) * sizeof(uint64_t); i < bytes; ++i)
    total += static_cast<uint64_t>(data[i]);
  return total;
}

size_t last_level_cache_bytes() {
  const size_t llc = cpu_info().llc_bytes;
  return llc != 0 ? llc : size_t{32} << 20;
}

namespace {
size_t default_array_bytes() {  // 4x the last-level cache, at least 64 MiB
  return std::max(4 * last_level_cache_bytes(), size_t{64} << 20);
}
}  // namespace

Result<double> sustained_read_gb_s(double seconds, int threads) {
  if (!(seconds > 0))
    return Status(ErrorCode::kInvalidArgument,
                  "sustained_read_gb_s: seconds: expected > 0, found " + std::to_string(seconds));
  if (threads <= 0) threads = parallel_threads();
  const int64_t n = static_cast<int64_t>(default_array_bytes() / sizeof(uint64_t));
  std::unique_ptr<uint64_t[]> a(new (std::nothrow) uint64_t[n]);  // [n], touched below
  if (!a)
    return Status(ErrorCode::kInternal, "sustained_read_gb_s: cannot allocate " +
                                            std::to_string(n * sizeof(uint64_t)) + " bytes");
  uint64_t* pa = a.get();
  split(n, threads, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) pa[i] = static_cast<uint64_t>(i);
  });
  const auto bytes = static_cast<size_t>(n) * sizeof(uint64_t);
  uint64_t sink = 0;
  int64_t passes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    sink += stream_read_pass(reinterpret_cast<const std::byte*>(pa), bytes, threads);
    ++passes;
    elapsed = seconds_since(t0);
  } while (elapsed < seconds);
  // The word sum of 0..n-1, once per pass (mod 2^64): checked so the passes cannot be elided.
  const uint64_t un = static_cast<uint64_t>(n);
  const uint64_t per_pass = un % 2 == 0 ? (un / 2) * (un - 1) : un * ((un - 1) / 2);
  if (sink != per_pass * static_cast<uint64_t>(passes))
    return Status(ErrorCode::kInternal, "sustained_read_gb_s: read-pass sum mismatch");
  return static_cast<double>(bytes) * static_cast<double>(passes) / elapsed / 1e9;
}

Result<StreamResult> stream_probe(const StreamOptions& options) {
  if (options.reps < 1)
    return Status(ErrorCode::kInvalidArgument,
                  "stream_probe: reps: expected >= 1, found " + std::to_string(options.reps));
  size_t bytes = options.array_bytes;
  if (bytes == 0) bytes = default_array_bytes();
  if (bytes < 1024)
    return Status(ErrorCode::kInvalidArgument,
                  "stream_probe: array_bytes: expected >= 1024, found " + std::to_string(bytes));
  int threads = options.threads;
  if (threads <= 0) threads = parallel_threads();
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
  split(n, threads, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      pa[i] = 1.0;
      pb[i] = 0.0;
      pc[i] = 0.0;
    }
  });

  const double array = static_cast<double>(n) * sizeof(double);
  double best_copy = 1e30, best_triad = 1e30, best_read = 1e30;
  uint64_t sum = 0;
  const double s = 3.0;
  // One untimed warm-up pass (page faults, frequency ramp), then `reps` timed passes.
  for (int rep = 0; rep <= options.reps; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    split(n, threads, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pc[i] = pa[i];
    });
    const double t_copy = seconds_since(t0);

    t0 = std::chrono::steady_clock::now();
    split(n, threads, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) pb[i] = pa[i] + s * pc[i];
    });
    const double t_triad = seconds_since(t0);

    t0 = std::chrono::steady_clock::now();
    const uint64_t acc = stream_read_pass(reinterpret_cast<const std::byte*>(pb),
                                          static_cast<size_t>(n) * sizeof(double), threads);
    const double t_read = seconds_since(t0);
    sum = acc;
    if (rep == 0) continue;
    best_copy = std::min(best_copy, t_copy);
    best_triad = std::min(best_triad, t_triad);
    best_read = std::min(best_read, t_read);
  }

  std::atomic<int64_t> bad{0};
  split(n, threads, [&](int64_t i0, int64_t i1) {
    int64_t local = 0;
    for (int64_t i = i0; i < i1; ++i) local += (pa[i] != 1.0) + (pc[i] != 1.0) + (pb[i] != 4.0);
    bad += local;
  });
  // The read pass sums 64-bit words (mod 2^64): n copies of the bits of 4.0.
  const uint64_t expect_sum = static_cast<uint64_t>(n) * std::bit_cast<uint64_t>(4.0);
  if (bad != 0 || sum != expect_sum)
    return Status(ErrorCode::kInternal,
                  "stream_probe: result check: expected a=1, c=1, b=4 and word sum " +
                      std::to_string(expect_sum) + ", found " + std::to_string(bad) +
                      " wrong elements and word sum " + std::to_string(sum));

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
