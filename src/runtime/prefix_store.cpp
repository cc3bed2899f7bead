#include "runtime/prefix_store.h"

#include <algorithm>

namespace attnres {

PrefixStore::PrefixStore(int64_t limit_bytes, int64_t page_bytes)
    : limit_(limit_bytes), page_bytes_(page_bytes) {}

std::vector<uint64_t> PrefixStore::prefix_hashes(std::span<const int32_t> tokens) {
  // h_p = mix(h_{p-1}, tokens[p-1]): the hash of the prefix of length p (splitmix64 finaliser
  // over the running value, so every prefix has its own well-spread key).
  std::vector<uint64_t> h(tokens.size());
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < tokens.size(); ++i) {
    x ^= static_cast<uint64_t>(static_cast<uint32_t>(tokens[i])) + 0x9e3779b97f4a7c15ull +
         (x << 6) + (x >> 2);
    uint64_t z = x + 0x9e3779b97f4a7c15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    h[i] = z ^ (z >> 31);
  }
  return h;
}

void PrefixStore::erase(Entries::iterator it) {
  const std::vector<uint64_t> h = prefix_hashes(it->tokens);
  for (uint64_t k : h) {
    auto c = prefix_count_.find(k);
    if (c != prefix_count_.end() && --c->second == 0) prefix_count_.erase(c);
  }
  auto range = by_hash_.equal_range(h.back());
  for (auto e = range.first; e != range.second; ++e) {
    if (e->second == it) {
      by_hash_.erase(e);
      break;
    }
  }
  bytes_ -= it->bytes;
  lru_.erase(it);
}

bool PrefixStore::evict_one() {
  if (lru_.empty()) return false;
  erase(std::prev(lru_.end()));
  ++stats_.evictions;
  return true;
}

void PrefixStore::clear() {
  while (!lru_.empty()) erase(lru_.begin());
}

bool PrefixStore::insert(std::span<const int32_t> tokens, const SequenceState& state,
                         std::span<const float> last_logits) {
  if (tokens.empty() || static_cast<int64_t>(tokens.size()) != state.position) return false;
  const std::vector<uint64_t> h = prefix_hashes(tokens);
  // Replace an entry of the same prefix (its state is the same: it absorbed the same tokens).
  auto range = by_hash_.equal_range(h.back());
  for (auto e = range.first; e != range.second; ++e) {
    if (std::equal(e->second->tokens.begin(), e->second->tokens.end(), tokens.begin(),
                   tokens.end())) {
      erase(e->second);
      break;
    }
  }
  PrefixEntry entry;
  entry.tokens.assign(tokens.begin(), tokens.end());
  entry.snapshot = state.snapshot();
  entry.last_logits.assign(last_logits.begin(), last_logits.end());
  entry.bytes = entry.snapshot.kda_bytes() + entry.snapshot.cache.num_pages() * page_bytes_ +
                static_cast<int64_t>(sizeof(float) * entry.last_logits.size() +
                                     sizeof(int32_t) * entry.tokens.size());
  if (entry.bytes > limit_) return false;
  while (bytes_ + entry.bytes > limit_ && evict_one()) {
  }
  bytes_ += entry.bytes;
  lru_.push_front(std::move(entry));
  by_hash_.emplace(h.back(), lru_.begin());
  for (uint64_t k : h) ++prefix_count_[k];
  ++stats_.inserts;
  return true;
}

PrefixStore::Match PrefixStore::lookup(std::span<const int32_t> prompt) {
  Match m;
  ++stats_.lookups;
  stats_.tokens_looked_up += static_cast<int64_t>(prompt.size());
  const std::vector<uint64_t> h = prefix_hashes(prompt);
  for (size_t p = h.size(); p > 0 && m.matched == 0; --p)
    if (prefix_count_.count(h[p - 1]) > 0) m.matched = static_cast<int64_t>(p);
  const int64_t n = static_cast<int64_t>(prompt.size());
  for (int64_t p = m.matched; p > 0 && m.entry == nullptr; --p) {
    auto range = by_hash_.equal_range(h[static_cast<size_t>(p - 1)]);
    for (auto e = range.first; e != range.second; ++e) {
      const std::vector<int32_t>& t = e->second->tokens;
      const bool usable = p < n || !e->second->last_logits.empty();
      if (usable && static_cast<int64_t>(t.size()) == p &&
          std::equal(t.begin(), t.end(), prompt.begin())) {
        lru_.splice(lru_.begin(), lru_, e->second);  // most recently used (iterators stay valid)
        m.entry = &*e->second;
        break;
      }
    }
  }
  const int64_t restored = m.entry != nullptr ? m.entry->snapshot.position : 0;
  stats_.tokens_matched += m.matched;
  stats_.tokens_restored += restored;
  stats_.tokens_recomputed += static_cast<int64_t>(prompt.size()) - restored;
  stats_.hits += m.entry != nullptr ? 1 : 0;
  return m;
}

}  // namespace attnres
