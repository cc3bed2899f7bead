// Byte-level BPE over a tiktoken rank table.
//
// Contract: a RankTable maps byte strings to ranks (token ids) and back; it is loaded from the
// tiktoken.model text format (one "<base64 bytes> <rank>" per line) and rejects malformed lines,
// duplicate byte strings and duplicate ranks with an error naming the file and line.
// byte_pair_encode() reproduces tiktoken's byte_pair_merge (tiktoken/src/lib.rs): starting from
// single bytes, repeatedly merge the adjacent pair whose concatenation has the lowest rank,
// the leftmost such pair on ties, until no adjacent pair is in the table; the result is the rank
// of every remaining part. Every single byte must have a rank for encoding to be total, which the
// loader checks (`require_all_bytes`).
//
// Thread-safety: a loaded RankTable is immutable and may be shared by any number of threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace attnres {

using TokenId = int32_t;

class RankTable {
 public:
  // Parses tiktoken.model text. `source` names the file in errors. Blank lines are skipped
  // (tiktoken's loader does the same); every other line must be "<base64> <rank>".
  static Result<RankTable> parse(std::string_view text, const std::string& source,
                                 bool require_all_bytes = true);
  static Result<RankTable> load(const std::string& path, bool require_all_bytes = true);

  // Rank of `bytes`, or -1 when the byte string is not a token.
  TokenId find(std::string_view bytes) const;
  // Bytes of `rank`; empty when the rank is a hole (is_token() false).
  std::string_view bytes(TokenId rank) const;
  bool is_token(TokenId rank) const {
    return rank >= 0 && static_cast<size_t>(rank) + 1 < offsets_.size() &&
           offsets_[rank + 1] > offsets_[rank];
  }
  size_t size() const { return count_; }  // number of tokens
  TokenId max_rank() const { return static_cast<TokenId>(offsets_.size()) - 2; }

 private:
  uint64_t hash(std::string_view s) const;
  void insert_slot(TokenId rank);

  std::string arena_;              // all token bytes, in rank order
  std::vector<uint32_t> offsets_;  // [max_rank + 2]: bytes of rank r = arena_[off[r], off[r+1])
  // Open-addressing table, size 2^k: (hash >> 32) << 32 | rank, kEmptySlot when empty. The
  // stored hash bits reject most non-matching slots without touching the token bytes.
  std::vector<uint64_t> slots_;
  // Direct tables for the commonest lookups in BPE: 1- and 2-byte strings. -1 = not a token.
  std::vector<TokenId> short_ranks_;  // [256 + 65536]: byte b at b, pair (a, b) at 256 + a*256 + b
  uint64_t slot_mask_ = 0;
  size_t count_ = 0;
};

// Scratch for byte_pair_encode, reused across calls so the hot loop does not allocate once it
// has grown to the longest piece seen.
struct BpeScratch {
  std::vector<uint32_t> starts;  // [n+1] part start offsets (linear path)
  std::vector<TokenId> ranks;    // [n]   rank of part i merged with part i+1
  std::vector<uint32_t> next, prev;
  std::vector<uint64_t> heap;  // (rank << 32 | start) entries of the heap path
};

// Appends the tokens of `piece` to `out`. Pieces longer than a threshold use a heap with lazy
// invalidation (O(n log n)); shorter ones the quadratic scan tiktoken itself uses. Both follow
// the same merge order (lowest rank, then leftmost start), so their output is identical.
void byte_pair_encode(const RankTable& table, std::string_view piece, BpeScratch& scratch,
                      std::vector<TokenId>& out);

// Scalar reference twin: tiktoken's quadratic algorithm, no scratch reuse. Tests compare it with
// byte_pair_encode on random pieces.
std::vector<TokenId> byte_pair_encode_ref(const RankTable& table, std::string_view piece);

// Base64 (RFC 4648, with padding) as used by tiktoken.model files.
bool base64_decode(std::string_view in, std::string& out);
std::string base64_encode(std::string_view in);

}  // namespace attnres
