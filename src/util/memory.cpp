#include "util/memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <functional>
#include <new>

namespace attnres {
namespace {

constexpr size_t kAlign = 64;  // every buffer and every weight starts on a cache line

size_t round_up(size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

AlignedBuffer allocate_aligned(size_t bytes) {
  const size_t size = round_up(bytes);
  void* p = std::aligned_alloc(kAlign, size);
  if (p == nullptr) throw std::bad_alloc();
  return AlignedBuffer(static_cast<std::byte*>(p));
}

WeightMemory::~WeightMemory() {
  for (const Chunk& c : chunks_) ::munmap(c.base, c.size);
}

std::byte* WeightMemory::allocate(size_t bytes) {
  const size_t size = round_up(bytes);
  if (chunks_.empty() || chunks_.back().size - chunks_.back().used < size) {
    const size_t map = std::max(kChunkBytes, size);
    void* p = ::mmap(nullptr, map, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    ::madvise(p, map, MADV_HUGEPAGE);  // advice only: without THP the pages are 4 KiB
    chunks_.push_back({static_cast<std::byte*>(p), map, 0});
  }
  Chunk& c = chunks_.back();
  std::byte* out = c.base + c.used;
  c.used += size;
  return out;
}

size_t WeightMemory::bytes_used() const {
  size_t n = 0;
  for (const Chunk& c : chunks_) n += c.used;
  return n;
}

bool WeightMemory::contains(const void* p, size_t bytes) const {
  const auto* b = static_cast<const std::byte*>(p);
  for (const Chunk& c : chunks_)
    if (std::greater_equal<>()(b, c.base) && std::less_equal<>()(b + bytes, c.base + c.used))
      return true;
  return false;
}

}  // namespace attnres
