// STREAM-style bandwidth probe (see stream_probe.h for the contract).
//
// The kernels are idempotent so every pass does the same work and the final contents have a
// closed form: a = 1 (read-only), copy c = a (-> 1), triad b = a + 3 c (-> 4), read: the sum
// of b's 64-bit words mod 2^64 (-> n times the bits of 4.0).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/stream_probe.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>

#include "kernels/stream_probe.h"
#include "util/cpu.h"
#include "util/memory.h"
#include "util/parallel.h"

HWY_BEFORE_NAMESPACE();
namespace attnres {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The sum of words [0, n) mod 2^64 in the widest vectors (as the kernels the probe stands for
// load), four vectors of partial sums so that add latency never caps a core's read rate.
uint64_t SumWords(const uint64_t* HWY_RESTRICT w, int64_t n) {
  const hn::ScalableTag<uint64_t> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    a0 = hn::Add(a0, hn::LoadU(d, w + i));
    a1 = hn::Add(a1, hn::LoadU(d, w + i + L));
    a2 = hn::Add(a2, hn::LoadU(d, w + i + 2 * L));
    a3 = hn::Add(a3, hn::LoadU(d, w + i + 3 * L));
  }
  // The lanes summed as unsigned words (a reduction intrinsic adds them as signed, which
  // overflows).
  HWY_ALIGN uint64_t lanes[hn::MaxLanes(d)];
  hn::Store(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)), d, lanes);
  uint64_t sum = 0;
  for (int64_t j = 0; j < L; ++j) sum += lanes[j];
  for (; i < n; ++i) {
    uint64_t x;
    std::memcpy(&x, w + i, sizeof(x));  // callers' data may be unaligned
    sum += x;
  }
  return sum;
}

}  // namespace HWY_NAMESPACE
}  // namespace attnres
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
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

HWY_EXPORT(SumWords);

uint64_t stream_read_pass(const std::byte* data, size_t bytes, int threads) {
  if (threads <= 0) threads = parallel_threads();
  const int64_t n = static_cast<int64_t>(bytes / sizeof(uint64_t));
  std::atomic<uint64_t> acc{0};
  // Integer adds (no floating-point assists on arbitrary bit patterns); one contiguous part per
  // thread. `data` may be unaligned: the words are loaded unaligned.
  const auto* words = reinterpret_cast<const uint64_t*>(data);
  split(n, threads, [&](int64_t begin, int64_t end) {
    acc += HWY_DYNAMIC_DISPATCH(SumWords)(words + begin, end - begin);
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
  WeightMemory memory;     // huge pages, as the weights (stream_probe.h)
  uint64_t* pa = nullptr;  // [n], touched below
  try {
    pa = reinterpret_cast<uint64_t*>(memory.allocate(static_cast<size_t>(n) * sizeof(uint64_t)));
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kInternal, "sustained_read_gb_s: cannot allocate " +
                                            std::to_string(n * sizeof(uint64_t)) + " bytes");
  }
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
  // On huge pages, as the weights (stream_probe.h). Uninitialised on purpose: the first touch
  // below places pages near the threads using them.
  WeightMemory memory;
  double *pa = nullptr, *pb = nullptr, *pc = nullptr;  // [n] each
  try {
    const size_t array_bytes = static_cast<size_t>(n) * sizeof(double);
    pa = reinterpret_cast<double*>(memory.allocate(array_bytes));
    pb = reinterpret_cast<double*>(memory.allocate(array_bytes));
    pc = reinterpret_cast<double*>(memory.allocate(array_bytes));
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kInternal,
                  "stream_probe: cannot allocate 3 arrays of " + std::to_string(bytes) + " bytes");
  }
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
#endif  // HWY_ONCE
