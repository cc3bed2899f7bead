#include "util/memory.h"

#include <new>

namespace attnres {

AlignedBuffer allocate_aligned(size_t bytes) {
  constexpr size_t kAlign = 64;
  const size_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, size);
  if (p == nullptr) throw std::bad_alloc();
  return AlignedBuffer(static_cast<std::byte*>(p));
}

}  // namespace attnres
