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

// fn(begin, end) over [0, n) in contiguous ranges of about n / (4 x threads) items (at least
// `grain`); all on the calling thread when n < 2 * grain.
template <typename Fn>
void parallel_for(int64_t n, int64_t grain, const Fn& fn) {
  const int64_t threads = parallel_threads();
  if (n <= 0) return;
  if (threads <= 1 || n < 2 * grain) {
    fn(int64_t{0}, n);
    return;
  }
  int64_t chunks = std::min<int64_t>(4 * threads, n / (grain > 0 ? grain : 1));
  if (chunks < 1) chunks = 1;
  parallel_tasks(chunks, [&](int64_t c) { fn(n * c / chunks, n * (c + 1) / chunks); });
}

// fn(begin, end) over [0, n) in contiguous ranges (about 4 per thread, claimed dynamically)
// when `parallel`, else fn(0, n) on the calling thread.
template <typename Fn>
void parallel_ranges(int64_t n, bool parallel, const Fn& fn) {
  if (n <= 0) return;
  const int64_t threads = parallel_threads();
  if (!parallel || threads <= 1 || n == 1) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t chunks = std::min<int64_t>(4 * threads, n);
  parallel_tasks(chunks, [&](int64_t c) { fn(n * c / chunks, n * (c + 1) / chunks); });
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
