// Rank table loading and byte-pair merging; see bpe.h for the contract.
#include "tokenizer/bpe.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "util/file.h"

namespace attnres {
namespace {

constexpr TokenId kNoRank = INT32_MAX;
constexpr uint64_t kEmptySlot = UINT64_MAX;
// Ranks above this are rejected: a table that large would be a corrupt file, and the decode
// table is dense in ranks.
constexpr int64_t kMaxRank = (int64_t{1} << 26) - 1;
// Pieces longer than this use the heap path of byte_pair_encode.
constexpr size_t kHeapThreshold = 128;

int8_t base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return static_cast<int8_t>(c - 'A');
  if (c >= 'a' && c <= 'z') return static_cast<int8_t>(c - 'a' + 26);
  if (c >= '0' && c <= '9') return static_cast<int8_t>(c - '0' + 52);
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

bool base64_decode(std::string_view in, std::string& out) {
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (in.back() == '=') pad = (in[in.size() - 2] == '=') ? 2 : 1;
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    int32_t v[4];
    for (size_t k = 0; k < 4; ++k) {
      const bool is_pad = last && k >= 4 - pad;
      v[k] = is_pad ? 0 : base64_value(static_cast<unsigned char>(in[i + k]));
      if (v[k] < 0) return false;
    }
    const uint32_t word = (static_cast<uint32_t>(v[0]) << 18) |
                          (static_cast<uint32_t>(v[1]) << 12) | (static_cast<uint32_t>(v[2]) << 6) |
                          static_cast<uint32_t>(v[3]);
    out.push_back(static_cast<char>(word >> 16));
    if (!(last && pad == 2)) out.push_back(static_cast<char>((word >> 8) & 0xff));
    if (!(last && pad >= 1)) out.push_back(static_cast<char>(word & 0xff));
  }
  return true;
}

std::string base64_encode(std::string_view in) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t word = static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << 16;
    if (i + 1 < in.size())
      word |= static_cast<uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8;
    if (i + 2 < in.size()) word |= static_cast<unsigned char>(in[i + 2]);
    out.push_back(kAlphabet[(word >> 18) & 63]);
    out.push_back(kAlphabet[(word >> 12) & 63]);
    out.push_back(i + 1 < in.size() ? kAlphabet[(word >> 6) & 63] : '=');
    out.push_back(i + 2 < in.size() ? kAlphabet[word & 63] : '=');
  }
  return out;
}

uint64_t RankTable::hash(std::string_view s) const {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ (s.size() * 0xff51afd7ed558ccdULL);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 29;
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < s.size(); ++k) {
    tail |= static_cast<uint64_t>(static_cast<unsigned char>(s[i + k])) << (8 * k);
  }
  h = (h ^ tail) * 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

void RankTable::insert_slot(TokenId rank) {
  const uint64_t h = hash(bytes(rank));
  uint64_t pos = h & slot_mask_;
  while (slots_[pos] != kEmptySlot) pos = (pos + 1) & slot_mask_;
  slots_[pos] = (h & 0xffffffff00000000ULL) | static_cast<uint32_t>(rank);
}

TokenId RankTable::find(std::string_view s) const {
  if (s.size() <= 2 && !short_ranks_.empty()) {
    if (s.empty()) return -1;
    const auto b0 = static_cast<unsigned char>(s[0]);
    return s.size() == 1 ? short_ranks_[b0]
                         : short_ranks_[256 + b0 * 256u + static_cast<unsigned char>(s[1])];
  }
  if (slots_.empty()) return -1;
  const uint64_t h = hash(s);
  const uint64_t tag = h & 0xffffffff00000000ULL;
  uint64_t pos = h & slot_mask_;
  while (true) {
    const uint64_t slot = slots_[pos];
    if (slot == kEmptySlot) return -1;
    if ((slot & 0xffffffff00000000ULL) != tag) {
      pos = (pos + 1) & slot_mask_;
      continue;
    }
    const TokenId r = static_cast<TokenId>(slot & 0xffffffffu);
    const uint32_t off = offsets_[r];
    if (offsets_[r + 1] - off == s.size() &&
        std::memcmp(arena_.data() + off, s.data(), s.size()) == 0)
      return r;
    pos = (pos + 1) & slot_mask_;
  }
}

std::string_view RankTable::bytes(TokenId rank) const {
  if (rank < 0 || static_cast<size_t>(rank) + 1 >= offsets_.size()) return {};
  return std::string_view(arena_).substr(offsets_[rank], offsets_[rank + 1] - offsets_[rank]);
}

Result<RankTable> RankTable::parse(std::string_view text, const std::string& source,
                                   bool require_all_bytes) {
  struct Entry {
    TokenId rank;
    uint32_t line;
    std::string bytes;
  };
  std::vector<Entry> entries;
  std::string decoded;
  uint32_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::string where = source + ":" + std::to_string(line_no);
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
      return Status(ErrorCode::kInvalidValue, where +
                                                  ": expected \"<base64 token> <rank>\", found \"" +
                                                  std::string(line.substr(0, 80)) + "\"");
    const std::string_view b64 = line.substr(0, sp);
    const std::string_view rank_str = line.substr(sp + 1);
    if (!base64_decode(b64, decoded))
      return Status(ErrorCode::kInvalidValue, where + ": token is not valid base64: \"" +
                                                  std::string(b64.substr(0, 80)) + "\"");
    int64_t rank = 0;
    bool ok = !rank_str.empty() && rank_str.size() <= 10;
    for (char c : rank_str) {
      if (c < '0' || c > '9') ok = false;
      if (ok) rank = rank * 10 + (c - '0');
    }
    if (!ok || rank > kMaxRank)
      return Status(ErrorCode::kInvalidValue, where + ": rank must be an integer in [0, " +
                                                  std::to_string(kMaxRank) + "], found \"" +
                                                  std::string(rank_str.substr(0, 20)) + "\"");
    entries.push_back({static_cast<TokenId>(rank), line_no, decoded});
  }
  if (entries.empty())
    return Status(ErrorCode::kInvalidValue, source + ": no tokens (empty rank file)");

  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.rank < b.rank; });
  for (size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].rank == entries[i - 1].rank)
      return Status(ErrorCode::kInconsistent,
                    source + ":" + std::to_string(std::max(entries[i].line, entries[i - 1].line)) +
                        ": duplicate rank " + std::to_string(entries[i].rank) + " (also on line " +
                        std::to_string(std::min(entries[i].line, entries[i - 1].line)) + ")");
  }

  RankTable t;
  const TokenId max_rank = entries.back().rank;
  t.offsets_.assign(static_cast<size_t>(max_rank) + 2, 0);
  size_t total = 0;
  for (const Entry& e : entries) total += e.bytes.size();
  t.arena_.reserve(total);
  size_t e = 0;
  for (TokenId r = 0; r <= max_rank; ++r) {
    t.offsets_[r] = static_cast<uint32_t>(t.arena_.size());
    if (e < entries.size() && entries[e].rank == r) t.arena_ += entries[e++].bytes;
  }
  t.offsets_[static_cast<size_t>(max_rank) + 1] = static_cast<uint32_t>(t.arena_.size());
  t.count_ = entries.size();

  size_t cap = 16;
  while (cap < 2 * entries.size()) cap <<= 1;
  t.slots_.assign(cap, kEmptySlot);
  t.slot_mask_ = cap - 1;
  for (const Entry& en : entries) {
    const TokenId existing = t.find(en.bytes);
    if (existing >= 0) {
      uint32_t other_line = 0;
      for (const Entry& o : entries)
        if (o.rank == existing) other_line = o.line;
      return Status(ErrorCode::kInconsistent,
                    source + ":" + std::to_string(en.line) + ": duplicate token bytes \"" +
                        base64_encode(en.bytes) + "\" (rank " + std::to_string(en.rank) +
                        ", already rank " + std::to_string(existing) + " on line " +
                        std::to_string(other_line) + ")");
    }
    t.insert_slot(en.rank);
  }
  t.short_ranks_.assign(256 + 65536, -1);
  for (const Entry& en : entries) {
    const auto* b = reinterpret_cast<const unsigned char*>(en.bytes.data());
    if (en.bytes.size() == 1) t.short_ranks_[b[0]] = en.rank;
    if (en.bytes.size() == 2) t.short_ranks_[256 + b[0] * 256u + b[1]] = en.rank;
  }
  if (require_all_bytes) {
    for (int b = 0; b < 256; ++b) {
      const char c = static_cast<char>(b);
      if (t.find(std::string_view(&c, 1)) < 0) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", b);
        return Status(ErrorCode::kInvalidValue, source + ": not a byte-level BPE: single byte " +
                                                    hex +
                                                    " has no rank (every byte must be a token)");
      }
    }
  }
  return t;
}

Result<RankTable> RankTable::load(const std::string& path, bool require_all_bytes) {
  ATTNRES_ASSIGN_OR_RETURN(std::string text, read_model_file(path, "tokenizer rank file"));
  return parse(text, path, require_all_bytes);
}

namespace {

// Rank of piece[a, b), or kNoRank.
inline TokenId rank_of(const RankTable& t, std::string_view piece, uint32_t a, uint32_t b) {
  const TokenId r = t.find(piece.substr(a, b - a));
  return r < 0 ? kNoRank : r;
}

void encode_linear(const RankTable& t, std::string_view piece, BpeScratch& s,
                   std::vector<TokenId>& out) {
  // starts[i]: start of part i; ranks[i]: rank of part i merged with part i+1.
  const size_t n = piece.size();
  s.starts.resize(n + 1);
  s.ranks.resize(n + 1);
  for (size_t i = 0; i <= n; ++i) s.starts[i] = static_cast<uint32_t>(i);
  size_t parts = n;  // number of parts; starts[parts] == n is the end sentinel
  for (size_t i = 0; i + 1 < parts; ++i)
    s.ranks[i] = rank_of(t, piece, s.starts[i], s.starts[i + 2]);
  if (parts > 0) s.ranks[parts - 1] = kNoRank;
  while (parts > 1) {
    TokenId best = kNoRank;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts; ++i) {
      if (s.ranks[i] < best) {
        best = s.ranks[i];
        at = i;
      }
    }
    if (best == kNoRank) break;
    // Merge part at+1 into part at.
    for (size_t i = at + 1; i < parts; ++i) {
      s.starts[i] = s.starts[i + 1];
      s.ranks[i] = s.ranks[i + 1];
    }
    --parts;
    s.starts[parts] = static_cast<uint32_t>(n);
    s.ranks[at] = at + 1 < parts ? rank_of(t, piece, s.starts[at], s.starts[at + 2]) : kNoRank;
    if (at > 0) s.ranks[at - 1] = rank_of(t, piece, s.starts[at - 1], s.starts[at + 1]);
  }
  for (size_t i = 0; i < parts; ++i)
    out.push_back(t.find(piece.substr(s.starts[i], s.starts[i + 1] - s.starts[i])));
}

void encode_heap(const RankTable& t, std::string_view piece, BpeScratch& s,
                 std::vector<TokenId>& out) {
  // Parts form a linked list indexed by their start offset; next[n] is the end sentinel.
  // ranks[i] is the current rank of part i merged with its successor; heap entries whose rank
  // no longer matches are stale and skipped. Ordering by (rank, start) is tiktoken's order.
  const uint32_t n = static_cast<uint32_t>(piece.size());
  constexpr uint32_t kDead = UINT32_MAX;
  s.next.resize(n + 1);
  s.prev.resize(n + 1);
  s.ranks.resize(n + 1);
  s.heap.clear();
  for (uint32_t i = 0; i <= n; ++i) {
    s.next[i] = i + 1;
    s.prev[i] = i == 0 ? kDead : i - 1;
  }
  auto pair_rank = [&](uint32_t i) -> TokenId {
    const uint32_t j = s.next[i];
    if (j >= n) return kNoRank;
    return rank_of(t, piece, i, s.next[j]);
  };
  auto push = [&](uint32_t i) {
    s.ranks[i] = pair_rank(i);
    if (s.ranks[i] != kNoRank) {
      s.heap.push_back(~((static_cast<uint64_t>(s.ranks[i]) << 32) | i));
      std::push_heap(s.heap.begin(), s.heap.end());  // max-heap of complements = min-heap
    }
  };
  for (uint32_t i = 0; i < n; ++i) push(i);
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end());
    const uint64_t e = ~s.heap.back();
    s.heap.pop_back();
    const uint32_t i = static_cast<uint32_t>(e & 0xffffffffu);
    const TokenId r = static_cast<TokenId>(e >> 32);
    if (s.next[i] == kDead || s.ranks[i] != r) continue;  // stale entry
    const uint32_t j = s.next[i];
    s.next[i] = s.next[j];
    s.prev[s.next[j]] = i;
    s.next[j] = kDead;
    push(i);
    if (s.prev[i] != kDead) push(s.prev[i]);
  }
  for (uint32_t i = 0; i < n; i = s.next[i]) out.push_back(t.find(piece.substr(i, s.next[i] - i)));
}

}  // namespace

void byte_pair_encode(const RankTable& table, std::string_view piece, BpeScratch& scratch,
                      std::vector<TokenId>& out) {
  if (piece.empty()) return;
  // tiktoken looks the whole piece up first; a piece that is itself a token is that token even
  // when merging would not reach it.
  const TokenId whole = table.find(piece);
  if (whole >= 0) {
    out.push_back(whole);
    return;
  }
  if (piece.size() <= kHeapThreshold) {
    encode_linear(table, piece, scratch, out);
  } else {
    encode_heap(table, piece, scratch, out);
  }
}

std::vector<TokenId> byte_pair_encode_ref(const RankTable& table, std::string_view piece) {
  std::vector<TokenId> out;
  if (piece.empty()) return out;
  const TokenId whole = table.find(piece);
  if (whole >= 0) return {whole};
  // parts: (start, rank of this part merged with the next) as in tiktoken's _byte_pair_merge.
  std::vector<std::pair<size_t, TokenId>> parts;
  for (size_t i = 0; i + 1 < piece.size(); ++i) {
    const TokenId r = table.find(piece.substr(i, 2));
    parts.push_back({i, r < 0 ? kNoRank : r});
  }
  parts.push_back({piece.size() - 1, kNoRank});
  parts.push_back({piece.size(), kNoRank});
  auto get_rank = [&](size_t i) -> TokenId {
    if (i + 3 >= parts.size()) return kNoRank;
    const TokenId r = table.find(piece.substr(parts[i].first, parts[i + 3].first - parts[i].first));
    return r < 0 ? kNoRank : r;
  };
  while (true) {
    TokenId best = kNoRank;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      if (parts[i].second < best) {
        best = parts[i].second;
        at = i;
      }
    }
    if (best == kNoRank) break;
    if (at > 0) parts[at - 1].second = get_rank(at - 1);
    parts[at].second = get_rank(at);
    parts.erase(parts.begin() + static_cast<ptrdiff_t>(at) + 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    out.push_back(table.find(piece.substr(parts[i].first, parts[i + 1].first - parts[i].first)));
  }
  return out;
}

}  // namespace attnres
