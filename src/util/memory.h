// Large scratch buffers: uninitialised, 64-byte aligned, and for sizes of a huge page or more
// aligned to 2 MiB and advised to the kernel as transparent-huge-page candidates
// (MADV_HUGEPAGE; a no-op where THP is off). A step's scratch is written before it is read, so
// zeroing it (what std::make_unique<T[]> does) would only add a pass over memory, and on a
// fresh buffer that pass is also where every 4 KiB page fault is taken; with 2 MiB pages one
// fault covers 512 of them and the kernels' TLB reach grows by the same factor.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

namespace attnres {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using ScratchBuffer = std::unique_ptr<std::byte[], FreeDeleter>;

// `bytes` (> 0) of uninitialised memory as described above; aborts when the system is out of
// memory, as operator new would.
ScratchBuffer allocate_scratch(size_t bytes);

}  // namespace attnres
