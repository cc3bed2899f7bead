// Uninitialised, 64-byte-aligned buffers: the step arena's blocks and a rank's private copies
// of its weight rows. Both are written in full before they are read, so zeroing them (what
// std::make_unique<T[]> does) would only add a pass over memory, and on a fresh buffer that
// pass is also where every page fault is taken.
//
// Not advised as transparent huge pages: measured on k3-mini (2026-12-02, two threads), 2 MiB
// pages for the step arena sped a 256-token prefill up by 15-25% but slowed decode of 16
// sequences together by ~20% (116-148 against 157-172 aggregate tok/s, alternated runs), and for
// the weights they slowed the MXFP4 expert GEMV fourfold; physically contiguous 2 MiB ranges
// put power-of-two-strided rows into the same cache sets.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

namespace attnres {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte[], FreeDeleter>;

// `bytes` (> 0) of uninitialised memory as described above; throws std::bad_alloc when the
// system is out of memory, as operator new would.
AlignedBuffer allocate_aligned(size_t bytes);

}  // namespace attnres
