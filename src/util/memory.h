// Uninitialised, 64-byte-aligned memory: the step arena's blocks (allocate_aligned) and the
// weights read from the files (WeightMemory). Both are written in full before they are read,
// so zeroing them (what std::make_unique<T[]> does) would only add a pass over memory, and on
// a fresh buffer that pass is also where every page fault is taken.
//
// The arena's blocks are faulted in whole when allocated (MADV_POPULATE_WRITE: one call instead
// of a trap per 4 KiB page at first touch, which a virtual machine makes dear). A fresh engine's
// first step takes those faults: on k3-mini (2026-12-04, two threads, `bench --reps 5
// --prompt-tokens 256 --gen-tokens 1`, three runs each) its first 256-token prefill ran at
// 0.93-0.98 of a warm engine's rate, against 0.88-0.92 with the pages faulted in as touched.
//
// The step arena is not advised as transparent huge pages: measured on k3-mini (2026-12-02,
// two threads), 2 MiB pages for it sped a 256-token prefill up by 15-25% but slowed decode of
// 16 sequences together by ~20% (116-148 against 157-172 aggregate tok/s, alternated runs).
// The weights are (WeightMemory): see there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace attnres {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<std::byte[], FreeDeleter>;

// `bytes` (> 0) of uninitialised memory as described above; throws std::bad_alloc when the
// system is out of memory, as operator new would.
AlignedBuffer allocate_aligned(size_t bytes);

// Memory for weights read from the files: tensors are placed one after another, each on a
// 64-byte boundary, in anonymous mappings of kChunkBytes (a larger tensor gets one of its own)
// that start on 2 MiB boundaries and are advised as transparent huge pages. Measured on k3-mini
// (2026-12-02, alternated runs, two threads, 32 + 128 tokens): decode 63.7 tok/s from such memory,
// 56-59 from one allocation per tensor on 4 KiB pages, 38-40 through the file mapping; a one-token
// `run` spent 2-6 s in the kernel loading the 2.6 GB into such memory against 10.5 s on 4 KiB
// pages. Pages are reserved as touched (MAP_NORESERVE), so the unused tail of the last chunk costs
// at most one huge page.
class WeightMemory {
 public:
  static constexpr size_t kChunkBytes = size_t{1} << 30;
  WeightMemory() = default;
  ~WeightMemory();
  WeightMemory(const WeightMemory&) = delete;
  WeightMemory& operator=(const WeightMemory&) = delete;

  // `bytes` (> 0) of uninitialised memory on a 64-byte boundary, valid as long as this object;
  // throws std::bad_alloc when no mapping can be made.
  std::byte* allocate(size_t bytes);
  // Whether [p, p + bytes) lies inside one allocation's chunk.
  bool contains(const void* p, size_t bytes) const;
  size_t bytes_used() const;  // allocated, with each allocation's padding to 64 bytes
  // Bytes of these chunks the kernel backs with transparent huge pages now (AnonHugePages in
  // /proc/self/smaps); 0 where that file cannot be read. Without them (THP "never", or no free
  // 2 MiB pages when the weights were read) the MXFP4 experts decode 1.3-4x more slowly
  // (README, "Weights in memory").
  size_t huge_page_bytes() const;

 private:
  struct Chunk {
    std::byte* base;
    size_t size, used;
  };
  std::vector<Chunk> chunks_;
};

// Memory for the per-sequence state a decode step reads whole: the KDA recurrent states
// (model/state.h, read and written) and the latent-cache pages (model/kv_cache.h). Carved from
// anonymous mappings advised as transparent huge pages, like the weights, because a step
// streams every layer's state from memory (the weights have pushed it out of the caches since
// the last step) and on 4 KiB pages each of those pages costs a TLB miss. Freed blocks are kept
// for the next allocation of the same size (a model's states are all one size, and so are its
// cache pages), so the mappings only grow to the most alive at once; pages are reserved as
// touched (MAP_NORESERVE). Thread-safe.
class StateMemory {
 public:
  static StateMemory& instance();
  // `bytes` (> 0) on a 64-byte boundary; throws std::bad_alloc when no mapping can be made.
  void* allocate(size_t bytes);
  // Gives back a block allocate(bytes) returned.
  void release(void* p, size_t bytes);

 private:
  StateMemory();
  struct Impl;
  Impl* impl_;
};

// std::allocator for containers that live in StateMemory.
template <typename T>
struct StateAllocator {
  using value_type = T;
  StateAllocator() = default;
  template <typename U>
  StateAllocator(const StateAllocator<U>&) {}  // NOLINT(google-explicit-constructor)
  T* allocate(size_t n) { return static_cast<T*>(StateMemory::instance().allocate(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { StateMemory::instance().release(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const StateAllocator<U>&) const {
    return true;
  }
};

// An address range [begin, end).
struct AddressRange {
  uintptr_t begin, end;
};

// The sum of `field` (a "Name:   N kB" line, e.g. "AnonHugePages") over the mappings of a
// /proc/PID/smaps text that overlap `ranges`, in bytes; a mapping that only partly overlaps
// counts at most its overlap.
size_t smaps_field_bytes(std::string_view smaps, std::span<const AddressRange> ranges,
                         std::string_view field);

// The system's transparent huge page mode: the bracketed word of kThpEnabledPath ("always",
// "madvise", "never"), or "unreadable".
inline constexpr const char* kThpEnabledPath = "/sys/kernel/mm/transparent_hugepage/enabled";
std::string thp_setting();

// Whether weights read into memory are worth a warning for their pages: at least 256 MiB of
// them (a small model's tensors may all sit in partly used 2 MiB ranges, which stay 4 KiB pages)
// and under half on huge pages.
inline bool few_huge_pages(int64_t bytes_in_memory, int64_t huge_page_bytes) {
  return bytes_in_memory >= (int64_t{256} << 20) && 2 * huge_page_bytes < bytes_in_memory;
}

// The warning every model command and `serve` show when few_huge_pages(): what was found,
// the THP setting, what it costs and what to do; "" otherwise.
std::string huge_pages_warning(int64_t bytes_in_memory, int64_t huge_page_bytes);

}  // namespace attnres
