// P ranks as threads of one process: a test double of the MPI communicator (the same
// collectives over shared memory), so rank-count invariance and the leader/follower protocol
// are tested in every build, with or without MPI. Each rank's thread runs its own model share,
// engine and OpenMP team, exactly as a process would.
#pragma once

#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "parallel/comm.h"

namespace attnres::test {

class ThreadGroup {
 public:
  explicit ThreadGroup(int ranks)
      : ranks_(ranks), barrier_(ranks), slots_(static_cast<size_t>(ranks)) {
    for (int r = 0; r < ranks; ++r) comms_.push_back(std::make_shared<Comm>(this, r));
  }
  int ranks() const { return ranks_; }
  std::shared_ptr<Communicator> comm(int rank) { return comms_[static_cast<size_t>(rank)]; }

  // Runs fn(rank) on one thread per rank; returns when every rank is done.
  void run(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks_; ++r) threads.emplace_back([&fn, r] { fn(r); });
    for (auto& t : threads) t.join();
  }

 private:
  struct Slot {
    const void* send = nullptr;
    int64_t value = 0;
  };

  class Comm final : public Communicator {
   public:
    Comm(ThreadGroup* g, int rank) : g_(g), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return g_->ranks_; }
    std::string kind() const override { return "threads"; }
    void allgatherv(const void* send, void* recv, std::span<const int64_t> bytes) override {
      g_->slots_[static_cast<size_t>(rank_)].send = send;
      g_->barrier_.arrive_and_wait();
      int64_t off = 0;
      for (int r = 0; r < size(); ++r) {
        const auto n = static_cast<size_t>(bytes[static_cast<size_t>(r)]);
        char* dst = static_cast<char*>(recv) + off;
        const void* src = g_->slots_[static_cast<size_t>(r)].send;
        if (src != dst && n > 0) std::memcpy(dst, src, n);
        off += static_cast<int64_t>(n);
      }
      g_->barrier_.arrive_and_wait();  // every peer has read this rank's block
    }
    std::unique_ptr<PendingCollective> start_allgatherv(const void* send, void* recv,
                                                        std::span<const int64_t> bytes) override {
      allgatherv(send, recv, bytes);
      return std::make_unique<Done>();
    }
    void broadcast(void* data, int64_t bytes, int root, bool) override {
      if (rank_ == root) g_->slots_[static_cast<size_t>(root)].send = data;
      g_->barrier_.arrive_and_wait();
      if (rank_ != root && bytes > 0)
        std::memcpy(data, g_->slots_[static_cast<size_t>(root)].send, static_cast<size_t>(bytes));
      g_->barrier_.arrive_and_wait();
    }
    int64_t max(int64_t v) override {
      g_->slots_[static_cast<size_t>(rank_)].value = v;
      g_->barrier_.arrive_and_wait();
      int64_t m = v;
      for (const Slot& s : g_->slots_) m = std::max(m, s.value);
      g_->barrier_.arrive_and_wait();
      return m;
    }
    void barrier() override { g_->barrier_.arrive_and_wait(); }
    [[noreturn]] void abort(int code) override {
      std::fprintf(stderr, "thread rank %d aborted the group (status %d)\n", rank_, code);
      std::abort();
    }

   private:
    struct Done final : PendingCollective {
      void wait() override {}
    };
    ThreadGroup* g_;
    int rank_;
  };

  int ranks_;
  std::barrier<> barrier_;
  std::vector<Slot> slots_;
  std::vector<std::shared_ptr<Comm>> comms_;
};

}  // namespace attnres::test
