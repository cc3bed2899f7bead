// Per-sequence model state carried between forward steps: the KDA recurrent state and conv
// histories of every KDA layer, and the MLA latent cache (one block table of pool pages for
// all MLA layers, model/kv_cache.h).
//
// Invariant: after a step over positions [p, p + T), every KDA layer's state has absorbed
// exactly tokens 0..p+T-1 and the latent cache holds p + T positions in every MLA layer;
// `position` == p + T == cache.size().
//
// Snapshots (the prefix store's unit): a copy of every KDA layer's state at an exact position
// and the latent pages of positions [0, position), shared. Restoring one into a sequence makes
// it exactly the sequence that had absorbed those tokens: the KDA state is the one of that
// position (never a later one), and the latent cache is cut to it.
//
// Tensor parallelism: a rank holds the KDA states of its own heads only (the recurrent state
// and conv windows are per head); the latent cache is per token, shared by every head, so every
// rank holds all of it. Memory accounting that decides admission or eviction uses
// kda_state_bytes(config, shard), the share of the rank with the most heads, so every rank
// makes the same decisions.
//
// Not thread-safe: owned by one engine.
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"
#include "model/kv_cache.h"
#include "model/options.h"
#include "util/memory.h"
#include "util/numeric.h"
#include "util/partition.h"
#include "util/status.h"

namespace attnres {

struct KdaState {
  // H: this rank's heads (all of them with one rank).
  std::vector<float> conv_q, conv_k, conv_v;  // [H*dk, W-1] last W-1 conv inputs, oldest first
  // [H, dk, dv] f32, on huge pages (util/memory.h, StateMemory): each decode step reads and
  // writes it whole.
  std::vector<float, StateAllocator<float>> recurrent;
  void clear();
  int64_t bytes() const;
};

// Bytes of the KDA states of one sequence of `config` (every KDA layer) on the rank of `shard`'s
// group with the most heads (the whole state with one rank): the same number on every rank.
int64_t kda_state_bytes(const ModelConfig& config, const Shard& shard = {});

struct SequenceSnapshot {
  int64_t position = 0;
  std::vector<KdaState> kda;  // [num_layers]; empty vectors for MLA layers
  SequenceCache cache;        // positions [0, position), pages shared
  int64_t kda_accounted = 0;  // kda_state_bytes(config, shard) of the state it was taken of
  // The bytes the KDA states count for in budgets (rank-independent, see the file comment).
  int64_t kda_bytes() const { return kda_accounted; }
};

struct SequenceState {
  std::vector<KdaState> kda;   // [num_layers]; empty vectors for MLA layers
  SequenceCache cache;         // latent cache of every MLA layer
  std::vector<int> mla_index;  // [num_layers] index among the MLA layers (-1: KDA layer)
  int64_t position = 0;        // tokens absorbed so far
  int64_t kda_accounted = 0;   // kda_state_bytes(config, shard)

  // Zero state for `config` whose latent cache takes pages from `pool` (whose dtype is the
  // cache dtype), holding the KDA states of `shard`'s heads. The KDA states are charged to
  // `budget` when given (released by release()), as kda_state_bytes(config, shard).
  static Result<SequenceState> create(const ModelConfig& config, KvPool& pool,
                                      MemoryBudget* budget = nullptr, const Shard& shard = {});
  SequenceState() = default;
  SequenceState(SequenceState&&) noexcept;
  SequenceState& operator=(SequenceState&&) noexcept;
  ~SequenceState();

  // Back to position 0 (zero KDA states, empty cache).
  void clear();
  // The state at the current position, sharing the latent pages.
  SequenceSnapshot snapshot() const;
  // Becomes the sequence the snapshot was taken of (same model and pool).
  void restore(const SequenceSnapshot& snap);

 private:
  void release_budget();
  MemoryBudget* budget_ = nullptr;
  int64_t charged_ = 0;
};

}  // namespace attnres
