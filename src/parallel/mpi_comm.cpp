// The MPI communicator (comm.h): the one file of attnres that includes <mpi.h>. Built only with
// ATTNRES_MPI (CMake option, on where MPI is found).
//
// MPI is initialised MPI_THREAD_FUNNELED: the thread that drives the engine makes every MPI call
// and the OpenMP team keeps computing between them. Errors use MPI's default handler
// (MPI_ERRORS_ARE_FATAL: the job is aborted), so no rank is left waiting on a dead peer; with
// Open MPI, mpirun also ends every rank when one exits non-zero or is killed by a signal.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <thread>
#include <vector>

#include "parallel/comm.h"

namespace attnres {
namespace {

// Largest block an MPI call moves at once (counts and displacements are ints).
constexpr int64_t kMaxCallBytes = int64_t{1} << 30;

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "error: rank %d: %s failed: %.*s\n", rank, what, len, msg);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

class MpiPending final : public PendingCollective {
 public:
  MPI_Request request = MPI_REQUEST_NULL;
  ~MpiPending() override {
    if (request != MPI_REQUEST_NULL) wait();
  }
  void wait() override { check(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait"); }
};

class DonePending final : public PendingCollective {
 public:
  void wait() override {}
};

class MpiComm final : public Communicator {
 public:
  MpiComm() {
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string kind() const override { return "MPI"; }

  void allgatherv(const void* send, void* recv, std::span<const int64_t> bytes) override {
    std::vector<int> counts, displs;
    if (!layout(bytes, counts, displs)) return by_broadcasts(send, recv, bytes);
    check(MPI_Allgatherv(in_place(send, recv, displs) ? MPI_IN_PLACE : send, counts[rank_],
                         MPI_BYTE, recv, counts.data(), displs.data(), MPI_BYTE, comm_),
          "MPI_Allgatherv");
  }

  std::unique_ptr<PendingCollective> start_allgatherv(const void* send, void* recv,
                                                      std::span<const int64_t> bytes) override {
    // Counts and displacements must outlive the request.
    counts_.clear();
    displs_.clear();
    if (!layout(bytes, counts_, displs_)) {
      by_broadcasts(send, recv, bytes);
      return std::make_unique<DonePending>();
    }
    auto p = std::make_unique<MpiPending>();
    check(MPI_Iallgatherv(in_place(send, recv, displs_) ? MPI_IN_PLACE : send, counts_[rank_],
                          MPI_BYTE, recv, counts_.data(), displs_.data(), MPI_BYTE, comm_,
                          &p->request),
          "MPI_Iallgatherv");
    return p;
  }

  void broadcast(void* data, int64_t bytes, int root, bool idle) override {
    auto* p = static_cast<char*>(data);
    for (int64_t off = 0; off < bytes; off += kMaxCallBytes) {
      const int n = static_cast<int>(std::min(kMaxCallBytes, bytes - off));
      if (!idle) {
        check(MPI_Bcast(p + off, n, MPI_BYTE, root, comm_), "MPI_Bcast");
        continue;
      }
      // Nonblocking on every rank (a blocking and a nonblocking broadcast do not match): the
      // root waits; a rank waiting for the root polls, sleeping between polls once the wait is
      // long, so an idle follower does not hold a core.
      MPI_Request req = MPI_REQUEST_NULL;
      check(MPI_Ibcast(p + off, n, MPI_BYTE, root, comm_, &req), "MPI_Ibcast");
      if (rank_ == root) {
        check(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait");
        continue;
      }
      int done = 0;
      for (int spins = 0;; ++spins) {
        check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (done) break;
        if (spins > 20000)
          std::this_thread::sleep_for(std::chrono::microseconds(spins > 40000 ? 1000 : 50));
      }
    }
  }

  int64_t max(int64_t v) override {
    int64_t out = 0;
    check(MPI_Allreduce(&v, &out, 1, MPI_INT64_T, MPI_MAX, comm_), "MPI_Allreduce");
    return out;
  }

  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }

  [[noreturn]] void abort(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this is for the compiler
  }

 private:
  // int counts and displacements of the blocks; false when they do not fit one call.
  bool layout(std::span<const int64_t> bytes, std::vector<int>& counts,
              std::vector<int>& displs) const {
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    if (total > kMaxCallBytes) return false;
    int64_t off = 0;
    for (int64_t b : bytes) {
      counts.push_back(static_cast<int>(b));
      displs.push_back(static_cast<int>(off));
      off += b;
    }
    return true;
  }
  bool in_place(const void* send, const void* recv, const std::vector<int>& displs) const {
    return send == static_cast<const char*>(recv) + displs[static_cast<size_t>(rank_)];
  }
  // A gather too large for int counts: every rank broadcasts its block in turn.
  void by_broadcasts(const void* send, void* recv, std::span<const int64_t> bytes) {
    int64_t off = 0;
    for (int r = 0; r < size_; ++r) {
      char* dst = static_cast<char*>(recv) + off;
      if (r == rank_ && send != dst)
        std::copy_n(static_cast<const char*>(send), bytes[static_cast<size_t>(r)], dst);
      broadcast(dst, bytes[static_cast<size_t>(r)], r, false);
      off += bytes[static_cast<size_t>(r)];
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<int> counts_, displs_;
};

}  // namespace

std::shared_ptr<Communicator> mpi_world(int* argc, char*** argv) {
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    std::fprintf(stderr, "error: MPI_Init_thread failed\n");
    std::exit(1);
  }
  if (provided < MPI_THREAD_FUNNELED) {
    std::fprintf(stderr, "error: the MPI library provides thread level %d, FUNNELED (%d) needed\n",
                 provided, MPI_THREAD_FUNNELED);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return std::make_shared<MpiComm>();
}

void mpi_finalize() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Finalize();
}

}  // namespace attnres
