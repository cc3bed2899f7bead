#include "model/kv_cache.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "util/memory.h"
#include "util/parallel.h"

namespace attnres {

Status MemoryBudget::take(int64_t bytes, const std::string& what) {
  if (!fits(bytes)) {
    return Status(ErrorCode::kResourceExhausted,
                  what + " needs " + std::to_string(bytes) + " bytes but the memory budget has " +
                      std::to_string(std::max<int64_t>(0, limit_ - used_)) + " of " +
                      std::to_string(limit_) + " bytes left");
  }
  used_ += bytes;
  return Status::ok();
}

namespace {

int64_t round64(int64_t n) {
  return (n + 63) / 64 * 64;
}

int64_t elem_bytes(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kBF16:
      return 2;
    case KvCacheDtype::kFP8:
      return 1;
    default:
      return 4;
  }
}

int count_mla_layers(const ModelConfig& c) {
  return c.schedule.num_mla;
}

}  // namespace

void KvPool::Free::operator()(std::byte* p) const {
  StateMemory::instance().release(p, bytes);
}

KvPool::KvPool(const ModelConfig& c, KvCacheDtype dtype, int64_t page_tokens, MemoryBudget* budget)
    : dtype_(dtype),
      page_tokens_(page_tokens),
      r_(c.kv_lora_rank),
      rope_(c.qk_rope_head_dim),
      layers_(count_mla_layers(c)),
      budget_(budget) {
  assert(dtype != KvCacheDtype::kAuto && page_tokens > 0);
  const int64_t e = elem_bytes(dtype);
  plane_bytes_[0] = round64(page_tokens * r_ * e);
  plane_bytes_[1] = round64(page_tokens * rope_ * e);
  plane_bytes_[2] = dtype == KvCacheDtype::kFP8 ? round64(page_tokens * 2 * 4) : 0;
  layer_bytes_ = plane_bytes_[0] + plane_bytes_[1] + plane_bytes_[2];
  page_bytes_ = layer_bytes_ * layers_;
}

KvPool::~KvPool() {
  if (budget_ != nullptr) budget_->give(pages_allocated() * page_bytes_);
}

int64_t KvPool::bytes_per_token_per_layer() const {
  return (r_ + rope_) * elem_bytes(dtype_) + (dtype_ == KvCacheDtype::kFP8 ? 8 : 0);
}

std::byte* KvPool::plane(PageId p, int m, int which) const {
  std::byte* base = storage_[static_cast<size_t>(p)].get() + layer_bytes_ * m;
  for (int i = 0; i < which; ++i) base += plane_bytes_[i];
  return base;
}

Result<PageId> KvPool::allocate() {
  if (!free_.empty()) {
    const PageId p = free_.back();
    free_.pop_back();
    refs_[static_cast<size_t>(p)] = 1;
    ++in_use_;
    return p;
  }
  if (budget_ != nullptr) {
    ATTNRES_RETURN_IF_ERROR(budget_->take(
        page_bytes_, "a latent-cache page of " + std::to_string(page_tokens_) + " positions"));
  }
  const auto bytes = static_cast<size_t>(page_bytes_);
  std::byte* mem = nullptr;
  try {
    mem = static_cast<std::byte*>(StateMemory::instance().allocate(bytes));
  } catch (const std::bad_alloc&) {
    if (budget_ != nullptr) budget_->give(page_bytes_);
    return Status(ErrorCode::kResourceExhausted, "cannot allocate a latent-cache page of " +
                                                     std::to_string(page_bytes_) + " bytes");
  }
  storage_.emplace_back(mem, Free{bytes});
  refs_.push_back(1);
  ++in_use_;
  return static_cast<PageId>(storage_.size() - 1);
}

void KvPool::release(PageId p) {
  int32_t& r = refs_[static_cast<size_t>(p)];
  assert(r > 0);
  if (--r == 0) {
    free_.push_back(p);
    --in_use_;
  }
}

Result<PageId> KvPool::copy(PageId src, int64_t rows) {
  ATTNRES_ASSIGN_OR_RETURN(const PageId dst, allocate());
  const int64_t e = elem_bytes(dtype_);
  for (int m = 0; m < layers_; ++m) {
    std::memcpy(c_kv(dst, m), c_kv(src, m), static_cast<size_t>(rows * r_ * e));
    std::memcpy(k_rot(dst, m), k_rot(src, m), static_cast<size_t>(rows * rope_ * e));
    if (dtype_ == KvCacheDtype::kFP8)
      std::memcpy(scales(dst, m), scales(src, m), static_cast<size_t>(rows * 2) * sizeof(float));
  }
  return dst;
}

// ---------------------------------------------------------------------------------------------

SequenceCache::~SequenceCache() {
  release_all();
}

SequenceCache::SequenceCache(SequenceCache&& o) noexcept
    : pool_(o.pool_), pages_(std::move(o.pages_)), len_(o.len_) {
  o.pages_.clear();
  o.len_ = 0;
}

SequenceCache& SequenceCache::operator=(SequenceCache&& o) noexcept {
  if (this != &o) {
    release_all();
    pool_ = o.pool_;
    pages_ = std::move(o.pages_);
    len_ = o.len_;
    o.pages_.clear();
    o.len_ = 0;
  }
  return *this;
}

void SequenceCache::release_all() {
  for (PageId p : pages_) pool_->release(p);
  pages_.clear();
  len_ = 0;
}

Status SequenceCache::reserve(int64_t n) {
  if (pool_ == nullptr || pool_->num_layers() == 0 || n <= len_) return Status::ok();
  const int64_t pt = pool_->page_tokens();
  // The page holding position len_ is written next: copy it first if others hold it too.
  const size_t first = static_cast<size_t>(len_ / pt);
  if (first < pages_.size() && pool_->refs(pages_[first]) > 1) {
    ATTNRES_ASSIGN_OR_RETURN(const PageId fresh, pool_->copy(pages_[first], len_ % pt));
    pool_->release(pages_[first]);
    pages_[first] = fresh;
  }
  const size_t need = static_cast<size_t>((n + pt - 1) / pt);
  while (pages_.size() < need) {
    ATTNRES_ASSIGN_OR_RETURN(const PageId p, pool_->allocate());
    pages_.push_back(p);
  }
  return Status::ok();
}

void SequenceCache::write(int m, int64_t p0, const float* c_kv, const float* k_rot, int64_t T) {
  const int64_t pt = pool_->page_tokens(), r = pool_->latent_rank(), R = pool_->rope_dim();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = p0 + t, row = pos % pt;
    const PageId page = pages_[static_cast<size_t>(pos / pt)];
    assert(pool_->refs(page) == 1);
    const float* src[2] = {c_kv + t * r, k_rot + t * R};
    std::byte* dst[2] = {pool_->c_kv(page, m), pool_->k_rot(page, m)};
    const int64_t w[2] = {r, R};
    for (int p = 0; p < 2; ++p) {
      switch (pool_->dtype()) {
        case KvCacheDtype::kBF16: {
          bf16* out = reinterpret_cast<bf16*>(dst[p]) + row * w[p];
          for (int64_t i = 0; i < w[p]; ++i) out[i] = f32_to_bf16(src[p][i]);
          break;
        }
        case KvCacheDtype::kFP8: {
          float amax = 0.0f;
          for (int64_t i = 0; i < w[p]; ++i) amax = std::max(amax, std::fabs(src[p][i]));
          const float scale = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
          pool_->scales(page, m)[row * 2 + p] = scale;
          uint8_t* out = reinterpret_cast<uint8_t*>(dst[p]) + row * w[p];
          for (int64_t i = 0; i < w[p]; ++i) out[i] = f32_to_fp8_e4m3(src[p][i] / scale);
          break;
        }
        default:
          std::memcpy(reinterpret_cast<float*>(dst[p]) + row * w[p], src[p],
                      sizeof(float) * static_cast<size_t>(w[p]));
      }
    }
  }
}

void SequenceCache::read(int m, int64_t n, float* c_kv, float* k_rot) const {
  const int64_t pt = pool_->page_tokens(), r = pool_->latent_rank(), R = pool_->rope_dim();
  parallel_ranges(n, n > 256, [&](int64_t pos_begin, int64_t pos_end) {
    for (int64_t pos = pos_begin; pos < pos_end; ++pos) {
      const int64_t row = pos % pt;
      const PageId page = pages_[static_cast<size_t>(pos / pt)];
      float* dst[2] = {c_kv + pos * r, k_rot + pos * R};
      const std::byte* src[2] = {pool_->c_kv(page, m), pool_->k_rot(page, m)};
      const int64_t w[2] = {r, R};
      for (int p = 0; p < 2; ++p) {
        switch (pool_->dtype()) {
          case KvCacheDtype::kBF16: {
            const bf16* in = reinterpret_cast<const bf16*>(src[p]) + row * w[p];
            for (int64_t i = 0; i < w[p]; ++i) dst[p][i] = bf16_to_f32(in[i]);
            break;
          }
          case KvCacheDtype::kFP8: {
            const float scale = pool_->scales(page, m)[row * 2 + p];
            const uint8_t* in = reinterpret_cast<const uint8_t*>(src[p]) + row * w[p];
            for (int64_t i = 0; i < w[p]; ++i) dst[p][i] = fp8_e4m3_to_f32(in[i]) * scale;
            break;
          }
          default:
            std::memcpy(dst[p], reinterpret_cast<const float*>(src[p]) + row * w[p],
                        sizeof(float) * static_cast<size_t>(w[p]));
        }
      }
    }
  });
}

template <typename T>
PagedRows<T> SequenceCache::c_kv_rows(int m, int64_t n, const T** pages) const {
  PagedRows<T> v{pages, pool_->page_tokens(), pool_->latent_rank(), n};
  for (int64_t k = 0; k < v.num_pages(); ++k)
    pages[k] = reinterpret_cast<const T*>(pool_->c_kv(pages_[static_cast<size_t>(k)], m));
  return v;
}

template <typename T>
PagedRows<T> SequenceCache::k_rot_rows(int m, int64_t n, const T** pages) const {
  PagedRows<T> v{pages, pool_->page_tokens(), pool_->rope_dim(), n};
  for (int64_t k = 0; k < v.num_pages(); ++k)
    pages[k] = reinterpret_cast<const T*>(pool_->k_rot(pages_[static_cast<size_t>(k)], m));
  return v;
}

template PagedRows<float> SequenceCache::c_kv_rows(int, int64_t, const float**) const;
template PagedRows<bf16> SequenceCache::c_kv_rows(int, int64_t, const bf16**) const;
template PagedRows<float> SequenceCache::k_rot_rows(int, int64_t, const float**) const;
template PagedRows<bf16> SequenceCache::k_rot_rows(int, int64_t, const bf16**) const;

void SequenceCache::truncate(int64_t n) {
  assert(n <= len_);
  len_ = n;
  if (pool_ == nullptr || pool_->num_layers() == 0) return;
  const size_t keep = static_cast<size_t>((n + pool_->page_tokens() - 1) / pool_->page_tokens());
  while (pages_.size() > keep) {
    pool_->release(pages_.back());
    pages_.pop_back();
  }
}

SequenceCache SequenceCache::share_prefix(const SequenceCache& src, int64_t n) {
  assert(n <= src.len_);
  SequenceCache c(src.pool_);
  c.len_ = n;
  if (src.pool_ == nullptr || src.pool_->num_layers() == 0) return c;
  const size_t keep =
      static_cast<size_t>((n + src.pool_->page_tokens() - 1) / src.pool_->page_tokens());
  c.pages_.assign(src.pages_.begin(), src.pages_.begin() + static_cast<std::ptrdiff_t>(keep));
  for (PageId p : c.pages_) src.pool_->retain(p);
  return c;
}

}  // namespace attnres
