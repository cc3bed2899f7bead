// Arena: per-step scratch memory. A forward step takes all its temporaries from one arena and
// releases them together with reset(). After the first step of a given shape the arena holds a
// single block big enough for it, so later steps of the same (or smaller) shape do no heap
// allocation at all (heap_allocations() lets tests check this).
// Not thread-safe: one arena per session; kernels receive plain pointers into it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "util/memory.h"

namespace attnres {

class Arena {
 public:
  Arena() = default;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&&) = default;
  Arena& operator=(Arena&&) = default;

  // n elements of T, 64-byte aligned, uninitialised; valid until reset().
  template <typename T>
  T* take(int64_t n) {
    return static_cast<T*>(take_bytes(static_cast<size_t>(n) * sizeof(T)));
  }
  // Releases everything taken. If the last step needed more than one block, the blocks are
  // replaced by one block of their total size.
  void reset();

  size_t capacity_bytes() const;
  size_t used_bytes() const { return used_total_; }
  int64_t heap_allocations() const { return heap_allocations_; }

 private:
  struct Block {
    AlignedBuffer data;  // uninitialised (util/memory.h)
    size_t size = 0;
  };
  void* take_bytes(size_t bytes);
  void add_block(size_t min_bytes);

  std::vector<Block> blocks_;
  size_t block_ = 0;   // current block index
  size_t offset_ = 0;  // offset inside the current block
  size_t used_total_ = 0;
  int64_t heap_allocations_ = 0;
};

}  // namespace attnres
