#include "util/parallel.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define ATTNRES_PAUSE() _mm_pause()
#else
#define ATTNRES_PAUSE() std::this_thread::yield()
#endif

namespace attnres {
namespace {

// How long an idle worker spins for the next region before it sleeps.
constexpr auto kSpin = std::chrono::microseconds(200);
// How long the caller spins for tasks other threads are running before it yields its core.
constexpr auto kCallerSpin = std::chrono::microseconds(500);

thread_local bool t_in_task = false;

class Pool {
 public:
  ~Pool() {
    stop_.store(true);
    epoch_.fetch_add(1, std::memory_order_release);
    epoch_.notify_all();
    for (auto& t : workers_) t.join();
  }

  int threads() const { return threads_.load(std::memory_order_relaxed); }

  void set_threads(int n) {
    n = std::max(1, n);
    // Workers start with every signal blocked, so a process signal (SIGINT, SIGTERM) reaches
    // the threads that chose to take it, never a worker inside a kernel.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    while (static_cast<int>(workers_.size()) < n - 1) {
      const int index = static_cast<int>(workers_.size());
      workers_.emplace_back([this, index] { work(index); });
    }
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    threads_.store(n, std::memory_order_relaxed);
  }

  void run(int64_t n, TaskRef task) {
    // Publish: the task, then the claim word (task count, next index), then wake the workers.
    task_ = &task;
    done_.store(0, std::memory_order_relaxed);
    claim_.store(static_cast<uint64_t>(n) << 32, std::memory_order_release);
    epoch_.fetch_add(1, std::memory_order_release);
    if (sleepers_.load(std::memory_order_acquire) > 0) epoch_.notify_all();
    t_in_task = true;
    drain();
    t_in_task = false;
    // Wait for tasks other threads claimed (never for threads that claimed nothing).
    // Claimed tasks are running, so their end is near: spin, and yield the core only once the
    // wait is long (a worker descheduled in the middle of its task).
    const auto start = std::chrono::steady_clock::now();
    for (int spins = 0; done_.load(std::memory_order_acquire) < n; ++spins) {
      ATTNRES_PAUSE();
      if ((spins & 255) == 255 && std::chrono::steady_clock::now() - start > kCallerSpin)
        std::this_thread::yield();
    }
  }

 private:
  // Claims and runs tasks of the current region until none is left. A claim succeeds only on
  // the current claim word, so a thread that read an older region's word claims nothing of it;
  // a successful claim keeps the region from ending, so task_ stays the region's.
  void drain() {
    uint64_t w = claim_.load(std::memory_order_acquire);
    while ((w & 0xffffffffu) < (w >> 32)) {
      if (!claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel)) continue;
      (*task_)(static_cast<int64_t>(w & 0xffffffffu));
      done_.fetch_add(1, std::memory_order_release);
      w = claim_.load(std::memory_order_acquire);
    }
  }

  void work(int index) {
    t_in_task = true;  // a region started from a task runs inline
    uint64_t seen = epoch_.load(std::memory_order_acquire);
    while (!stop_.load(std::memory_order_relaxed)) {
      uint64_t e = epoch_.load(std::memory_order_acquire);
      const auto start = std::chrono::steady_clock::now();
      const bool active = index < threads() - 1;  // workers past the thread count just sleep
      for (int i = 0; e == seen; ++i) {
        ATTNRES_PAUSE();
        e = epoch_.load(std::memory_order_acquire);
        if (!active || ((i & 63) == 63 && std::chrono::steady_clock::now() - start > kSpin)) {
          sleepers_.fetch_add(1, std::memory_order_acq_rel);
          epoch_.wait(seen, std::memory_order_acquire);
          sleepers_.fetch_sub(1, std::memory_order_acq_rel);
          e = epoch_.load(std::memory_order_acquire);
        }
      }
      seen = e;
      if (index < threads() - 1) drain();
    }
  }

  std::atomic<int> threads_{1};
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> claim_{0};  // (task count << 32) | next task
  std::atomic<int64_t> done_{0};
  std::atomic<uint64_t> epoch_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  const TaskRef* task_ = nullptr;
};

Pool& pool() {
  static Pool* p = [] {
    auto* q = new Pool();  // never destroyed: workers may still spin when static objects die
    q->set_threads(physical_cores());
    return q;
  }();
  return *p;
}

}  // namespace

int physical_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return std::max(1u, std::thread::hardware_concurrency());
  std::set<std::string> cores;  // one entry per physical core (its SMT sibling list)
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(c) +
                    "/topology/thread_siblings_list");
    std::string siblings;
    cores.insert(f >> siblings ? siblings : "cpu" + std::to_string(c));
  }
  return std::max<int>(1, static_cast<int>(cores.size()));
}

namespace {

// A task's range [next, end) on parallel_split's axis, packed in one word so that the owner's
// claim of a piece and a thief's cut of the end are single compare-exchanges on the same value.
struct alignas(64) SplitSlot {
  std::atomic<uint64_t> word{0};
};
constexpr uint64_t Pack(int64_t next, int64_t end) {
  return (static_cast<uint64_t>(end) << 32) | static_cast<uint64_t>(next);
}
constexpr int64_t Next(uint64_t w) {
  return static_cast<int64_t>(w & 0xffffffffu);
}
constexpr int64_t End(uint64_t w) {
  return static_cast<int64_t>(w >> 32);
}

}  // namespace

void parallel_split(int64_t n, int64_t threads, RangeRef fn) {
  if (n <= 0) return;
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  // The axis in units of `unit` items, so that positions fit in 32 bits (a batch's cost axis
  // counts multiply-adds).
  const int64_t unit = (n + (int64_t{1} << 31) - 1) >> 31;
  const int64_t m = (n + unit - 1) / unit;
  threads = std::min(threads, m);
  const int64_t min_piece = std::max<int64_t>(1, m / (kSplitPiecesPerThread * threads));
  std::vector<SplitSlot> heap;
  SplitSlot local[8];
  SplitSlot* slots = local;
  if (threads > 8) {
    heap = std::vector<SplitSlot>(static_cast<size_t>(threads));
    slots = heap.data();
  }
  for (int64_t i = 0; i < threads; ++i)
    slots[i].word.store(Pack(m * i / threads, m * (i + 1) / threads), std::memory_order_relaxed);
  parallel_tasks(threads, [&](int64_t i) {
    SplitSlot& own = slots[i];
    for (;;) {
      // Run the own range while it lasts, half of what is left of it at a time.
      uint64_t w = own.word.load(std::memory_order_acquire);
      while (Next(w) < End(w)) {
        const int64_t lo = Next(w),
                      hi = std::min(End(w), lo + std::max(min_piece, (End(w) - lo + 1) / 2));
        if (!own.word.compare_exchange_weak(w, Pack(hi, End(w)), std::memory_order_acq_rel))
          continue;  // w reloaded: a thief moved the end
        fn(lo * unit, std::min(n, hi * unit));
        w = own.word.load(std::memory_order_acquire);
      }
      // Steal the back half of the largest range left.
      int64_t victim = -1, left = 0;
      uint64_t seen = 0;  // the victim's word as the scan read it
      for (int64_t j = 0; j < threads; ++j) {
        const uint64_t v = slots[j].word.load(std::memory_order_acquire);
        if (End(v) - Next(v) > left) {
          left = End(v) - Next(v);
          victim = j;
          seen = v;
        }
      }
      if (victim < 0) return;  // nothing left anywhere
      // The back half, the larger if odd.
      const int64_t mid = End(seen) - (left + 1) / 2;
      if (!slots[victim].word.compare_exchange_strong(seen, Pack(Next(seen), mid),
                                                      std::memory_order_acq_rel))
        continue;  // it changed since the scan: look again
      own.word.store(Pack(mid, End(seen)), std::memory_order_release);
    }
  });
}

int parallel_threads() {
  return pool().threads();
}

void set_parallel_threads(int threads) {
  pool().set_threads(threads);
}

void parallel_tasks(int64_t n, TaskRef task) {
  if (n <= 0) return;
  if (n == 1 || t_in_task || pool().threads() <= 1) {
    for (int64_t i = 0; i < n; ++i) task(i);
    return;
  }
  pool().run(n, task);
}

}  // namespace attnres
