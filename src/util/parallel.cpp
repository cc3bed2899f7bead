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
