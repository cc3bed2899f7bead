// The pool's range helpers: every item is covered once, by contiguous non-empty ranges, whatever
// the thread count and however the threads interleave.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "util/parallel.h"

namespace attnres {
namespace {

// Restores the thread count a test changed.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(parallel_threads()) { set_parallel_threads(n); }
  ~ThreadCount() { set_parallel_threads(saved_); }

 private:
  int saved_;
};

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

// The ranges must tile [0, n) exactly: sorted, they start at 0, each begins where the previous
// ended, none is empty, the last ends at n.
void ExpectTiles(Ranges ranges, int64_t n) {
  std::sort(ranges.begin(), ranges.end());
  ASSERT_FALSE(ranges.empty());
  int64_t at = 0;
  for (const auto& [b, e] : ranges) {
    EXPECT_EQ(b, at) << "n = " << n;
    EXPECT_LT(b, e) << "n = " << n;
    at = e;
  }
  EXPECT_EQ(at, n);
}

template <typename Split>
Ranges Collect(const Split& split) {
  std::mutex m;
  Ranges ranges;
  split([&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(m);
    ranges.emplace_back(b, e);
  });
  return ranges;
}

TEST(ParallelRanges, CoverEveryItemOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadCount tc(threads);
    for (int64_t n : {1, 2, 7, 8, 9, 20, 21, 100, 1000, 4097}) {
      for (bool parallel : {false, true}) {
        const Ranges r = Collect([&](const auto& fn) { parallel_ranges(n, parallel, fn); });
        ExpectTiles(r, n);
        if (!parallel || threads == 1) {
          EXPECT_EQ(r.size(), 1u);
        }
      }
    }
  }
}

TEST(ParallelRanges, NothingForAnEmptyRange) {
  ThreadCount tc(2);
  int calls = 0;
  parallel_ranges(0, true, [&](int64_t, int64_t) { ++calls; });
  parallel_split(0, 2, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

// The ranges tile the axis, none longer than half a thread's share (or the minimum piece);
// positions past 32 bits (a batch's cost axis) are scaled, not truncated.
TEST(ParallelSplit, PiecesTileTheRange) {
  for (int threads : {2, 3, 12}) {
    ThreadCount tc(threads);
    for (int64_t n :
         {int64_t{2}, int64_t{5}, int64_t{1000}, int64_t{1} << 20, (int64_t{1} << 40) + 12345}) {
      const Ranges r = Collect([&](const auto& fn) { parallel_split(n, threads, fn); });
      ExpectTiles(r, n);
      const int64_t unit = (n + (int64_t{1} << 31) - 1) >> 31;
      const int64_t m = (n + unit - 1) / unit, ways = std::min<int64_t>(threads, m);
      const int64_t min_piece = std::max<int64_t>(1, m / (kSplitPiecesPerThread * ways));
      const int64_t share = (m + ways - 1) / ways;
      const int64_t longest = std::max(min_piece, (share + 1) / 2) * unit;
      for (const auto& [b, e] : r) EXPECT_LE(e - b, longest) << "n = " << n;
    }
  }
}

// A thread held up in a piece holds up the region by that piece only: while whichever thread
// took the first piece stays in it, the other runs its own share and steals the rest.
TEST(ParallelSplit, AnotherThreadTakesWhatAHeldThreadLeaves) {
  ThreadCount tc(2);
  const int64_t n = 64;
  const auto caller = std::this_thread::get_id();
  // A worker joins the regions published after it started: wait until one has run a task.
  std::atomic<bool> worker_ran{false};
  for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
       !worker_ran && std::chrono::steady_clock::now() < until;) {
    parallel_tasks(2, [&](int64_t) {
      if (std::this_thread::get_id() != caller) worker_ran = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
  ASSERT_TRUE(worker_ran) << "the pool's worker never ran a task";
  std::atomic<bool> first{true};
  std::atomic<int64_t> held_items{0}, other_items{0};
  std::mutex m;
  std::thread::id held;
  std::vector<std::thread::id> others;
  parallel_split(n, 2, [&](int64_t b, int64_t e) {
    if (!first.exchange(false)) {
      {
        std::lock_guard<std::mutex> lock(m);
        others.push_back(std::this_thread::get_id());
      }
      other_items += e - b;
      return;
    }
    {
      std::lock_guard<std::mutex> lock(m);
      held = std::this_thread::get_id();
    }
    held_items += e - b;
    // Held until the other thread has run the rest (bounded, should it never start).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (held_items + other_items < n && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT_EQ(held_items + other_items, n);
  EXPECT_LE(held_items.load(), n / 4) << "at most half of the held thread's share";
  EXPECT_FALSE(others.empty());
  for (const auto& id : others) EXPECT_NE(id, held) << "the held thread ran a second piece";
}

}  // namespace
}  // namespace attnres
