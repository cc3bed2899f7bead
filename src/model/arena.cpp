#include "model/arena.h"

#include <algorithm>

namespace attnres {
namespace {
constexpr size_t kAlign = 64;
size_t align_up(size_t v) {
  return (v + kAlign - 1) & ~(kAlign - 1);
}
}  // namespace

void Arena::add_block(size_t min_bytes) {
  const size_t prev = blocks_.empty() ? 0 : blocks_.back().size;
  const size_t size = std::max({min_bytes + kAlign, prev * 2, size_t{1} << 20});
  Block b;
  b.data = allocate_aligned(size);
  b.size = size;
  blocks_.push_back(std::move(b));
  ++heap_allocations_;
}

void* Arena::take_bytes(size_t bytes) {
  bytes = align_up(std::max<size_t>(bytes, 1));
  for (;;) {
    if (block_ < blocks_.size()) {
      Block& b = blocks_[block_];
      const auto base = reinterpret_cast<uintptr_t>(b.data.get());
      const size_t start = align_up(base + offset_) - base;
      if (start + bytes <= b.size) {
        offset_ = start + bytes;
        used_total_ += bytes;
        return b.data.get() + start;
      }
      if (block_ + 1 < blocks_.size()) {
        ++block_;
        offset_ = 0;
        continue;
      }
    }
    add_block(bytes);
    block_ = blocks_.size() - 1;
    offset_ = 0;
  }
}

void Arena::reset() {
  if (blocks_.size() > 1) {
    size_t total = 0;
    for (const Block& b : blocks_) total += b.size;
    blocks_.clear();
    Block b;
    b.data = allocate_aligned(total);
    b.size = total;
    blocks_.push_back(std::move(b));
    ++heap_allocations_;
  }
  block_ = 0;
  offset_ = 0;
  used_total_ = 0;
}

size_t Arena::capacity_bytes() const {
  size_t total = 0;
  for (const Block& b : blocks_) total += b.size;
  return total;
}

}  // namespace attnres
