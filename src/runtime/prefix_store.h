// Prefix store: snapshots of sequences at exact positions, keyed by the tokens they absorbed,
// so a new request whose prompt starts with a stored prefix restores it and prefills only the
// rest (../shared/docs/serving.md §4).
//
// A KDA layer's state folds in every earlier token, so a cached prefix is reusable only at a
// position where a snapshot of every KDA state exists: an entry is exactly (tokens [0, p),
// the KDA states after them, the latent pages of positions [0, p), and optionally the logits
// after the last of them). Lookup returns the deepest entry whose tokens are a prefix of the
// prompt; nothing past an entry's position is ever reused (restoring cuts the latent cache to
// it). Keys are chained hashes of the token prefix, verified against the stored tokens, so a
// hash collision can never restore the wrong prefix.
//
// Memory: bounded by `limit_bytes` (KDA state copies + the pages an entry holds, counted in
// full even when shared + its logits); the least recently used entries are evicted first.
// Counters make a silent 0% hit rate visible: tokens matched (the longest common prefix with
// any entry), tokens restored from a snapshot, tokens recomputed.
//
// Not thread-safe: owned by one engine.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/state.h"

namespace attnres {

struct PrefixEntry {
  std::vector<int32_t> tokens;     // the prefix; tokens.size() == snapshot.position
  SequenceSnapshot snapshot;       // the state after it
  std::vector<float> last_logits;  // [V] logits after the last token, or empty
  int64_t bytes = 0;
};

struct PrefixStoreStats {
  int64_t lookups = 0, hits = 0;  // hits: lookups that restored something
  int64_t tokens_looked_up = 0;   // prompt tokens of every lookup
  int64_t tokens_matched = 0;     // longest common prefix with a stored entry, summed
  int64_t tokens_restored = 0;    // positions restored from snapshots, summed
  int64_t tokens_recomputed = 0;  // prompt tokens that had to be prefilled, summed
  int64_t inserts = 0, evictions = 0;
};

class PrefixStore {
 public:
  // `page_bytes`: bytes of one latent-cache page (what an entry's pages are charged).
  PrefixStore(int64_t limit_bytes, int64_t page_bytes);

  // Stores the state of a sequence that absorbed exactly `tokens` (state.position ==
  // tokens.size() > 0), with the logits after the last token if given. An entry for the same
  // prefix is replaced. Evicts least recently used entries to stay within the limit; an entry
  // larger than the whole limit is not stored. Returns whether it was stored.
  bool insert(std::span<const int32_t> tokens, const SequenceState& state,
              std::span<const float> last_logits = {});

  struct Match {
    const PrefixEntry* entry = nullptr;  // deepest stored prefix of the prompt, or null
    int64_t matched = 0;                 // longest common prefix with any entry's tokens
  };
  // The deepest entry whose tokens are a prefix of `prompt` and that leaves something to
  // sample from: shorter than the prompt, or the whole prompt with its last logits. Marks it
  // used (LRU) and counts the lookup (restored = its position, recomputed = the rest).
  Match lookup(std::span<const int32_t> prompt);

  // Drops the least recently used entry; false if the store is empty.
  bool evict_one();
  void clear();

  int64_t bytes() const { return bytes_; }
  int64_t limit() const { return limit_; }
  size_t size() const { return lru_.size(); }
  const PrefixStoreStats& stats() const { return stats_; }

 private:
  using Entries = std::list<PrefixEntry>;  // most recently used first
  static std::vector<uint64_t> prefix_hashes(std::span<const int32_t> tokens);
  void erase(Entries::iterator it);

  int64_t limit_, page_bytes_;
  int64_t bytes_ = 0;
  Entries lru_;
  // Hash of an entry's whole prefix -> entries (verified by their tokens on lookup).
  std::unordered_multimap<uint64_t, Entries::iterator> by_hash_;
  // Hash of every prefix of every entry -> how many entries have it (for tokens_matched).
  std::unordered_map<uint64_t, int32_t> prefix_count_;
  PrefixStoreStats stats_;
};

}  // namespace attnres
