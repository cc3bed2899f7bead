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
#include <cstdint>

namespace attnres {

// A non-owning reference to a callable void(Args...), valid while the callable lives.
template <typename... Args>
class CallRef {
 public:
  template <typename F>
  CallRef(const F& f)  // NOLINT: implicit by design
      : obj_(&f), call_([](const void* o, Args... a) { (*static_cast<const F*>(o))(a...); }) {}
  void operator()(Args... a) const { call_(obj_, a...); }

 private:
  const void* obj_;
  void (*call_)(const void*, Args...);
};
using TaskRef = CallRef<int64_t>;            // task(i)
using RangeRef = CallRef<int64_t, int64_t>;  // fn(begin, end)

// The physical cores this process may run on (its CPU affinity; SMT siblings count once), >= 1.
int physical_cores();

// Threads a region may use (the caller included); default: physical_cores().
int parallel_threads();
// Sets the thread count (>= 1); starts pool workers as needed. Not while a region runs.
void set_parallel_threads(int threads);

// task(i) for every i in [0, n); returns when all have returned. One thread, or n == 1, or a
// call from inside a task: all on the calling thread, in order.
void parallel_tasks(int64_t n, TaskRef task);

// fn(lo, hi) over [0, n) on `threads` tasks, in contiguous ranges, with the work balanced by
// stealing. Task i owns [n i / threads, n (i + 1) / threads) and runs it front to back in
// pieces of half what is left of it (at least n / (kSplitPiecesPerThread x threads)); a task
// whose range is used up takes the back half of the largest range another task has not yet
// claimed, and so on until nothing is left (a task that starts late may find nothing). So each
// thread streams one long run of its data front to back in a few calls, and threads that run at
// different speeds still end within about one short piece of each other: on a shared machine
// one vCPU ran an FMA loop 1.45x slower than the other for seconds at a time (2026-12-06).
inline constexpr int64_t kSplitPiecesPerThread = 16;
void parallel_split(int64_t n, int64_t threads, RangeRef fn);

// fn(begin, end) over [0, n) in contiguous, non-empty ranges when `parallel` (parallel_split
// over the pool's threads), else fn(0, n) on the calling thread. Which thread runs an item never
// changes its arithmetic. Even a few items (heads, row groups) go as one contiguous run per
// thread, not one item a claim: adjacent items are adjacent memory, and claims alternating
// between the cores put neighbouring items on different cores (likely each core's prefetcher
// then fetched lines of the other's next item; not measured). The KDA delta rule of a decode
// step on k3-mini (8 heads of 64 KiB state, 2 threads) took 20.5-22.1 us a layer this way
// against 32.2-34.6 us by single claims where memory streamed fast, 18.9-21.6 against 20.6-23.7
// where slow (docs/performance.md, "Contiguous ranges for few items").
template <typename Fn>
void parallel_ranges(int64_t n, bool parallel, const Fn& fn) {
  if (n <= 0) return;
  const int64_t threads = parallel_threads();
  if (!parallel || threads <= 1 || n == 1) {
    fn(int64_t{0}, n);
    return;
  }
  parallel_split(n, threads, fn);
}

}  // namespace attnres
