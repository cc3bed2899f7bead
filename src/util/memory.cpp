#include "util/memory.h"

#include <sys/mman.h>

#include <new>

namespace attnres {

ScratchBuffer allocate_scratch(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const bool huge = bytes >= kHugePage;
  const size_t align = huge ? kHugePage : 64;
  const size_t size = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, size);
  if (p == nullptr) throw std::bad_alloc();
  // Advice only: a kernel without THP (or with it disabled) returns an error that changes
  // nothing about the memory, so it is ignored.
  if (huge) (void)::madvise(p, size, MADV_HUGEPAGE);
  return ScratchBuffer(static_cast<std::byte*>(p));
}

}  // namespace attnres
