// The MLA latent cache of every sequence of an engine, in fixed-size pages from one pool, and
// the byte budget that bounds it together with the sequences' KDA states.
//
// A page holds `page_tokens` consecutive positions of one sequence for EVERY MLA layer (one
// block table per sequence serves all layers): per MLA layer m, c_kv [page_tokens, r] and
// k_rot [page_tokens, R] in the cache dtype, and for FP8 the per-token scales [page_tokens, 2]
// f32 (scale = amax / 448 of that part of the row, so the normalised c_kv and the unnormalised
// k_rot each use the full fp8 range). Each plane is 64-byte aligned inside the page.
//
// Pages are reference-counted: sequences with a common prefix (and the snapshots of the prefix
// store) share its pages; a shared page is copied before it is written (copy-on-write), so a
// page is only ever written by the one sequence holding it alone.
//
// Memory: page storage is allocated on first use, recycled through a free list and never
// returned to the system before the pool is destroyed; the number of pages that may exist is
// bounded by the MemoryBudget (which the KDA states of the sequences draw from too). Running out
// is a kResourceExhausted error, never an abort.
//
// Thread-safety: none. One engine (one thread) owns the pool and every cache using it; the
// forward step only reads and writes rows of pages its caller reserved beforehand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/mla.h"  // PagedRows
#include "model/options.h"
#include "util/numeric.h"
#include "util/status.h"

namespace attnres {

// Bytes that caches, states and snapshots may hold together. `limit` < 0 means unbounded.
class MemoryBudget {
 public:
  explicit MemoryBudget(int64_t limit = -1) : limit_(limit) {}
  // Takes `bytes` if they fit; kResourceExhausted naming `what` otherwise.
  Status take(int64_t bytes, const std::string& what);
  void give(int64_t bytes) { used_ -= bytes; }
  bool fits(int64_t bytes) const { return limit_ < 0 || used_ + bytes <= limit_; }
  int64_t used() const { return used_; }
  int64_t limit() const { return limit_; }
  int64_t available() const { return limit_ < 0 ? INT64_MAX : limit_ - used_; }

 private:
  int64_t limit_;
  int64_t used_ = 0;
};

using PageId = int32_t;

class KvPool {
 public:
  // `budget` must outlive the pool; nullptr = unbounded.
  KvPool(const ModelConfig& config, KvCacheDtype dtype, int64_t page_tokens,
         MemoryBudget* budget = nullptr);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  // A page with one reference; kResourceExhausted when the budget has no room for another.
  Result<PageId> allocate();
  void retain(PageId p) { ++refs_[static_cast<size_t>(p)]; }
  void release(PageId p);
  int32_t refs(PageId p) const { return refs_[static_cast<size_t>(p)]; }
  // A new page holding a copy of rows [0, rows) of `p` (every layer); one reference.
  Result<PageId> copy(PageId p, int64_t rows);

  // Plane pointers of MLA layer `m` (0-based among the MLA layers) in page `p`.
  std::byte* c_kv(PageId p, int m) const { return plane(p, m, 0); }
  std::byte* k_rot(PageId p, int m) const { return plane(p, m, 1); }
  float* scales(PageId p, int m) const { return reinterpret_cast<float*>(plane(p, m, 2)); }

  KvCacheDtype dtype() const { return dtype_; }
  int64_t page_tokens() const { return page_tokens_; }
  int64_t latent_rank() const { return r_; }
  int64_t rope_dim() const { return rope_; }
  int num_layers() const { return layers_; }
  int64_t page_bytes() const { return page_bytes_; }
  // Bytes one position takes in one layer (values, plus fp8 scales).
  int64_t bytes_per_token_per_layer() const;
  int64_t pages_in_use() const { return in_use_; }
  int64_t pages_allocated() const { return static_cast<int64_t>(storage_.size()); }

 private:
  std::byte* plane(PageId p, int m, int which) const;

  KvCacheDtype dtype_;
  int64_t page_tokens_, r_, rope_;
  int layers_;
  int64_t plane_bytes_[3] = {0, 0, 0};  // c_kv, k_rot, scales (64-byte multiples)
  int64_t layer_bytes_ = 0, page_bytes_ = 0;
  MemoryBudget* budget_;
  struct Free {  // back to StateMemory (util/memory.h), where every page is allocated
    size_t bytes;
    void operator()(std::byte* p) const;
  };
  std::vector<std::unique_ptr<std::byte, Free>> storage_;  // [pages]
  std::vector<int32_t> refs_;                              // [pages]; 0 = free
  std::vector<PageId> free_;
  int64_t in_use_ = 0;
};

// The latent cache of one sequence: its block table into the pool and the number of positions
// it holds. Invariant: pages_.size() == ceil(capacity / page_tokens) with capacity >= size(); a
// page the cache holds alone may be written, a shared one only after reserve() copied it.
class SequenceCache {
 public:
  SequenceCache() = default;
  explicit SequenceCache(KvPool* pool) : pool_(pool) {}
  ~SequenceCache();
  SequenceCache(SequenceCache&& o) noexcept;
  SequenceCache& operator=(SequenceCache&& o) noexcept;
  SequenceCache(const SequenceCache&) = delete;
  SequenceCache& operator=(const SequenceCache&) = delete;

  // Makes positions [size(), n) writable: allocates the missing pages and copies a shared page
  // that holds position size(). On failure nothing the cache holds changes (pages it allocated
  // are kept for the next attempt).
  Status reserve(int64_t n);
  // Writes rows [p0, p0 + T) of MLA layer m (p0 + T <= reserved positions): c_kv [T, r],
  // k_rot [T, R], converted to the cache dtype.
  void write(int m, int64_t p0, const float* c_kv, const float* k_rot, int64_t T);
  // Sets the number of positions held after a step wrote rows up to n.
  void set_size(int64_t n) { len_ = n; }
  // Rows [0, n) of layer m dequantised: c_kv [n, r], k_rot [n, R].
  void read(int m, int64_t n, float* c_kv, float* k_rot) const;
  // In-place views of layer m's rows [0, n) (bf16 or f32 caches; `pages` receives one pointer
  // per page and must hold ceil(n / page_tokens) of them).
  template <typename T>
  PagedRows<T> c_kv_rows(int m, int64_t n, const T** pages) const;
  template <typename T>
  PagedRows<T> k_rot_rows(int m, int64_t n, const T** pages) const;

  // Keeps positions [0, n) (n <= size()) and releases the pages past them.
  void truncate(int64_t n);
  // A cache holding the first n positions of `src` (n <= src.size()), sharing its pages.
  static SequenceCache share_prefix(const SequenceCache& src, int64_t n);

  int64_t size() const { return len_; }
  int64_t num_pages() const { return static_cast<int64_t>(pages_.size()); }
  const std::vector<PageId>& pages() const { return pages_; }
  KvPool* pool() const { return pool_; }

 private:
  void release_all();
  KvPool* pool_ = nullptr;
  std::vector<PageId> pages_;
  int64_t len_ = 0;
};

}  // namespace attnres
