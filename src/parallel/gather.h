// Tensor-parallel all-gathers of column-split activations (../shared/docs/parallel.md): a
// sharded operation computes this rank's contiguous share of a [rows, cols] result's columns
// (output rows of a projection, or heads), then every rank assembles the whole result. The
// gather copies bits (f32 values travel as f32, values already rounded to bf16 as their bf16
// bits, which is exact), so an assembled matrix is bitwise the one a single process computes.
//
// Several parts that are ready together travel in ONE collective (fused): each rank's block is
// its columns of every part, packed row by row. A started gather lets independent work run
// while it is in flight (start() ... finish()); one gather is in flight at a time.
//
// Contract: every rank calls gather()/start() with the same parts (shapes and partitions; the
// pointers are its own), in the same order. Not thread-safe: the engine's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "parallel/comm.h"
#include "util/partition.h"

namespace attnres {

// One part of a gather: `full` is [rows, units * unit] f32 with row stride ld (0: the width);
// rank r owns the columns of units Shard::range_of(units, r), i.e. [begin * unit, end * unit).
// This rank's columns are read from `local` (row stride local_ld; 0: its width) or, when
// local is null, are already in place in `full`.
struct GatherPart {
  float* full = nullptr;
  int64_t rows = 0;
  int64_t units = 0, unit = 1;
  int64_t ld = 0;
  const float* local = nullptr;
  int64_t local_ld = 0;
  // Every value is a bf16 value (its low 16 bits are zero): 2 bytes each on the wire.
  bool bf16 = false;

  int64_t width() const { return units * unit; }
};

// Counters of the collectives a rank made (`attnres bench` reads them).
struct CommStats {
  int64_t collectives = 0;   // gathers + control broadcasts and reductions
  int64_t gathers = 0;       // all-gathers (a fused gather counts once)
  int64_t gather_bytes = 0;  // bytes of the assembled results (every rank's share, as sent)
  double seconds = 0;        // wall time inside collectives (waiting included)
};

class TensorParallel {
 public:
  explicit TensorParallel(std::shared_ptr<Communicator> comm);
  Communicator& comm() { return *comm_; }
  const std::shared_ptr<Communicator>& comm_ptr() const { return comm_; }
  Shard shard() const { return {comm_->rank(), comm_->size()}; }
  int ranks() const { return comm_->size(); }

  // Assembles every part on every rank (one collective). With one rank: copies `local` into
  // place, if given.
  void gather(std::span<const GatherPart> parts);
  // The same in two halves; between them the parts' buffers must not be touched.
  void start(std::span<const GatherPart> parts);
  void finish();

  // What a gather does with one rank: copies each part's `local` (if any) into place.
  static void copy_local(std::span<const GatherPart> parts);

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }

 private:
  void pack(std::span<const GatherPart> parts);
  void unpack();

  std::shared_ptr<Communicator> comm_;
  CommStats stats_;
  std::vector<GatherPart> parts_;      // of the gather in flight
  std::vector<int64_t> block_bytes_;   // [ranks]
  std::vector<int64_t> block_offset_;  // [ranks]
  std::vector<std::byte> staging_;     // every rank's block, in rank order
  std::unique_ptr<PendingCollective> pending_;
  bool direct_ = false;  // one f32 row in place: gathered straight into `full`
  double started_ = 0;
};

// Seconds on a monotonic clock (for CommStats).
double comm_clock();

}  // namespace attnres
