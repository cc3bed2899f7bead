// The communicator every multi-process part of attnres talks through: rank, size, all-gather,
// broadcast, barrier, a max-reduction (the "did any rank fail" check) and abort. It is the only
// interface the engine sees; `<mpi.h>` is included by one file, mpi_comm.cpp, which implements
// it over MPI when the build has MPI (ATTNRES_MPI). The default is the single process, where
// every collective is a no-op (or a copy), so the same code is the serial engine.
//
// Contract: every rank calls the same collectives in the same order with matching sizes
// (collectives are not matched by tag); a collective that a peer never reaches blocks, so
// callers keep every rank on the same schedule (runtime/follower.h). Collectives are called
// from one thread per process (the thread that drives the engine; MPI is initialised
// FUNNELED), never from inside an OpenMP region.
// Failure policy: an MPI error aborts the whole job (MPI's default handler); abort() ends every
// rank at once with a non-zero status.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace attnres {

// A collective started by Communicator::start_allgatherv(); wait() completes it. Until then the
// send and receive buffers belong to the collective.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Where the ranks run, for messages ("MPI", "threads", "single process").
  virtual std::string kind() const = 0;

  // All-gather of byte blocks: rank r contributes bytes[r] bytes (bytes has size() entries,
  // the same on every rank); `recv` receives the blocks in rank order, back to back. `send` is
  // this rank's block and may be recv + (its offset in recv) (in place).
  virtual void allgatherv(const void* send, void* recv, std::span<const int64_t> bytes) = 0;
  // The same, started now and completed by wait(), so independent work can run meanwhile.
  virtual std::unique_ptr<PendingCollective> start_allgatherv(const void* send, void* recv,
                                                              std::span<const int64_t> bytes) = 0;
  // `bytes` bytes from `root` to every rank. With `idle` (which every rank must pass alike), a
  // rank that waits does not spin: it polls with short sleeps (a follower waiting for the
  // leader's next request).
  virtual void broadcast(void* data, int64_t bytes, int root, bool idle = false) = 0;
  // The largest of every rank's v.
  virtual int64_t max(int64_t v) = 0;
  virtual void barrier() = 0;
  // Ends every rank now with exit status `code` (after this rank printed why).
  [[noreturn]] virtual void abort(int code) = 0;
};

// The single process: rank 0 of 1.
class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string kind() const override { return "single process"; }
  void allgatherv(const void* send, void* recv, std::span<const int64_t> bytes) override;
  std::unique_ptr<PendingCollective> start_allgatherv(const void* send, void* recv,
                                                      std::span<const int64_t> bytes) override;
  void broadcast(void*, int64_t, int, bool) override {}
  int64_t max(int64_t v) override { return v; }
  void barrier() override {}
  [[noreturn]] void abort(int code) override;
};

// The process group of this process: MPI_COMM_WORLD when the build has MPI and the process was
// started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE / PMIX_RANK / PMI_RANK), else
// the single process. start_process_group() must run first (main()); later calls return the
// same communicator.
std::shared_ptr<Communicator> process_group();
// Initialises MPI (MPI_Init_thread, FUNNELED) when this process was started by an MPI launcher
// and the build has MPI; returns a message when it was but the build has none (a launcher with
// P > 1 would otherwise run P independent copies), else an empty string.
std::string start_process_group(int* argc, char*** argv);
// Finalises MPI (after every collective is done). Idempotent.
void end_process_group();
// Whether this build can run on several processes (built with MPI).
bool built_with_mpi();

// Implemented in mpi_comm.cpp (MPI builds only).
std::shared_ptr<Communicator> mpi_world(int* argc, char*** argv);
void mpi_finalize();

}  // namespace attnres
