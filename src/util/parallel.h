// Parallel regions on a pool of our own, built for machines other work shares.
//
// A region is n tasks; the calling thread and the pool's workers claim them one at a time from
// a shared counter, and the region ends when every task has run. Nobody waits for a thread to
// arrive: a worker the OS has not scheduled takes no task, and the caller runs whatever is left
// itself, so on a busy machine a region costs what the threads that actually run can do, never
// a scheduler time slice (an OpenMP team waits at its barriers for every member). Workers spin
// briefly after a region (regions of a decode step follow each other within microseconds), then
// sleep on a futex.
//
// Results never depend on the thread count or on which thread runs a task: callers only split
// work whose per-element arithmetic does not depend on the split.
//
// Thread-safety: regions are started by one thread at a time (the engine's); a region started
// from inside a task runs on the calling thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace attnres {

// A non-owning reference to a callable void(int64_t), valid while the callable lives.
class TaskRef {
 public:
  template <typename F>
  TaskRef(const F& f)  // NOLINT: implicit by design
      : obj_(&f), call_([](const void* o, int64_t i) { (*static_cast<const F*>(o))(i); }) {}
  void operator()(int64_t i) const { call_(obj_, i); }

 private:
  const void* obj_;
  void (*call_)(const void*, int64_t);
};

// The physical cores this process may run on (its CPU affinity; SMT siblings count once), >= 1.
int physical_cores();

// Threads a region may use (the caller included); default: physical_cores().
int parallel_threads();
// Sets the thread count (>= 1); starts pool workers as needed. Not while a region runs.
void set_parallel_threads(int threads);

// task(i) for every i in [0, n); returns when all have returned. One thread, or n == 1, or a
// call from inside a task: all on the calling thread, in order.
void parallel_tasks(int64_t n, TaskRef task);

// fn(lo, hi) over [0, n) on `threads` tasks by guided self-scheduling: each task claims
// [lo, lo + remaining / threads) of what is left, at least n / (kGuidedMinClaimsPerThread x
// threads), until nothing is left (a task that starts late finds nothing and returns). The
// first ranges are long, so each streams a long run of its data front to back; the last are
// short, so threads that run at different speeds end within one short range of each other. On
// a shared machine that matters: one vCPU ran an FMA loop 1.45x slower than the other for
// seconds at a time (2026-12-06), so ranges fixed in advance wait for the slower thread.
inline constexpr int64_t kGuidedMinClaimsPerThread = 16;
template <typename Fn>
void parallel_guided(int64_t n, int64_t threads, const Fn& fn) {
  if (n <= 0) return;
  if (threads <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::atomic<int64_t> next{0};
  const int64_t min_claim = std::max<int64_t>(1, n / (kGuidedMinClaimsPerThread * threads));
  parallel_tasks(threads, [&](int64_t) {
    int64_t lo = next.load(std::memory_order_relaxed);
    while (lo < n) {  // a failed exchange reloads lo
      const int64_t hi = std::min(n, lo + std::max(min_claim, (n - lo) / threads));
      if (next.compare_exchange_weak(lo, hi, std::memory_order_relaxed)) {
        fn(lo, hi);
        lo = next.load(std::memory_order_relaxed);
      }
    }
  });
}

// fn(begin, end) over [0, n) in contiguous, non-empty ranges claimed dynamically when
// `parallel`, else fn(0, n) on the calling thread. Up to kRangeItemsPerThread items per thread
// (heads, row groups: items of real size) are claimed one at a time; more, by parallel_guided.
// Which thread runs an item never changes its arithmetic.
inline constexpr int64_t kRangeItemsPerThread = 4;
template <typename Fn>
void parallel_ranges(int64_t n, bool parallel, const Fn& fn) {
  if (n <= 0) return;
  const int64_t threads = parallel_threads();
  if (!parallel || threads <= 1 || n == 1) {
    fn(int64_t{0}, n);
    return;
  }
  if (n <= kRangeItemsPerThread * threads) {
    parallel_tasks(n, [&](int64_t i) { fn(i, i + 1); });
    return;
  }
  parallel_guided(n, threads, fn);
}

// fn(i) on `ways` tasks that split a range statically: task i of `ways` takes
// [count * i / ways, count * (i + 1) / ways) (empty ranges skipped); `ways` = the thread count,
// or 1 when !parallel.
template <typename Fn>
void for_static_ranges(int64_t count, bool parallel, const Fn& body) {
  const int64_t ways = parallel ? std::min<int64_t>(parallel_threads(), count) : 1;
  if (ways <= 1) {
    if (count > 0) body(int64_t{0}, count);
    return;
  }
  parallel_tasks(ways, [&](int64_t i) {
    const int64_t begin = count * i / ways, end = count * (i + 1) / ways;
    if (begin < end) body(begin, end);
  });
}

}  // namespace attnres
