#include "util/memory.h"

#include <sanitizer/asan_interface.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <fstream>
#include <functional>
#include <mutex>
#include <new>
#include <span>
#include <sstream>
#include <string>
#include <unordered_map>

namespace attnres {
namespace {

constexpr size_t kAlign = 64;  // every buffer and every weight starts on a cache line

size_t round_up(size_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

constexpr size_t kHugePage = size_t{2} << 20;

// An anonymous mapping of `bytes` rounded up to whole 2 MiB pages, starting on a 2 MiB boundary
// (so that every 2 MiB range of it can be a huge page: one huge page more is mapped and the
// unaligned ends unmapped) and advised as transparent huge pages (advice only: without THP the
// pages are 4 KiB). Pages are reserved as touched (MAP_NORESERVE). Throws std::bad_alloc.
std::span<std::byte> map_huge_page_chunk(size_t bytes) {
  const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  const size_t map = size + kHugePage;
  void* p = ::mmap(nullptr, map, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto raw = reinterpret_cast<uintptr_t>(p);
  const uintptr_t base = (raw + kHugePage - 1) & ~(kHugePage - 1);
  if (base > raw) ::munmap(p, base - raw);
  if (raw + map > base + size)
    ::munmap(reinterpret_cast<void*>(base + size), raw + map - (base + size));
  ::madvise(reinterpret_cast<void*>(base), size, MADV_HUGEPAGE);
  return {reinterpret_cast<std::byte*>(base), size};
}

}  // namespace

AlignedBuffer allocate_aligned(size_t bytes) {
  const size_t size = round_up(bytes);
  void* p = std::aligned_alloc(kAlign, size);
  if (p == nullptr) throw std::bad_alloc();
#ifdef MADV_POPULATE_WRITE
  // Fault the whole pages of the buffer in with one call (advice only: kernels before 5.14
  // refuse it, and the pages then fault in as touched).
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(p) + page - 1) & ~(page - 1);
  const auto end = (reinterpret_cast<uintptr_t>(p) + size) & ~(page - 1);
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
#endif
  return AlignedBuffer(static_cast<std::byte*>(p));
}

WeightMemory::~WeightMemory() {
  for (const Chunk& c : chunks_) ::munmap(c.base, c.size);
}

std::byte* WeightMemory::allocate(size_t bytes) {
  const size_t size = round_up(bytes);
  if (chunks_.empty() || chunks_.back().size - chunks_.back().used < size) {
    const std::span<std::byte> chunk = map_huge_page_chunk(std::max(kChunkBytes, size));
    chunks_.push_back({chunk.data(), chunk.size(), 0});
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

size_t WeightMemory::huge_page_bytes() const {
  if (chunks_.empty()) return 0;
  std::ifstream in("/proc/self/smaps");
  if (!in) return 0;
  std::ostringstream text;
  text << in.rdbuf();
  std::vector<AddressRange> ranges;
  for (const Chunk& c : chunks_)
    ranges.push_back(
        {reinterpret_cast<uintptr_t>(c.base), reinterpret_cast<uintptr_t>(c.base) + c.size});
  return smaps_field_bytes(text.str(), ranges, "AnonHugePages");
}

bool WeightMemory::contains(const void* p, size_t bytes) const {
  const auto* b = static_cast<const std::byte*>(p);
  for (const Chunk& c : chunks_)
    if (std::greater_equal<>()(b, c.base) && std::less_equal<>()(b + bytes, c.base + c.used))
      return true;
  return false;
}

// Under AddressSanitizer each block is followed by a poisoned redzone and a released block is
// poisoned until it is handed out again, so overruns and uses after release are reported as for
// heap memory.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kStateRedzone = kAlign;
#else
constexpr size_t kStateRedzone = 0;
#endif

namespace {

// The block size of allocate(bytes): release(p, bytes) must find the same free list.
size_t state_block_size(size_t bytes) {
  return round_up(std::max<size_t>(bytes, 1));
}

}  // namespace

struct StateMemory::Impl {
  static constexpr size_t kChunkBytes = size_t{64} << 20;
  std::mutex mu;
  std::byte* next = nullptr;  // the current chunk's unused part [next, end)
  std::byte* end = nullptr;
  std::unordered_map<size_t, std::vector<void*>> free;  // by state_block_size
};

StateMemory::StateMemory() : impl_(new Impl()) {}

StateMemory& StateMemory::instance() {
  static StateMemory* m = new StateMemory();  // never destroyed: states may outlive statics
  return *m;
}

void* StateMemory::allocate(size_t bytes) {
  const size_t size = state_block_size(bytes);
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (auto it = m.free.find(size); it != m.free.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    ASAN_UNPOISON_MEMORY_REGION(p, size);
    return p;
  }
  if (static_cast<size_t>(m.end - m.next) < size + kStateRedzone) {
    const std::span<std::byte> chunk =
        map_huge_page_chunk(std::max(Impl::kChunkBytes, size + kStateRedzone));
    m.next = chunk.data();
    m.end = m.next + chunk.size();  // the previous chunk's rest stays untouched: never committed
  }
  std::byte* p = m.next;
  m.next += size + kStateRedzone;
  ASAN_POISON_MEMORY_REGION(p + size, kStateRedzone);
  return p;
}

void StateMemory::release(void* p, size_t bytes) {
  if (p == nullptr) return;
  Impl& m = *impl_;
  const size_t size = state_block_size(bytes);
  std::lock_guard<std::mutex> lock(m.mu);
  ASAN_POISON_MEMORY_REGION(p, size);
  m.free[size].push_back(p);
}

std::string thp_setting() {
  std::ifstream in(kThpEnabledPath);
  std::string line;
  if (!in || !std::getline(in, line)) return "unreadable";
  const size_t open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return line;
  return line.substr(open + 1, close - open - 1);
}

std::string huge_pages_warning(int64_t bytes_in_memory, int64_t huge_page_bytes) {
  if (!few_huge_pages(bytes_in_memory, huge_page_bytes)) return "";
  const std::string thp = thp_setting();
  char line[512];
  std::snprintf(line, sizeof line,
                "warning: only %.2f of the %.2f GB of weights read into memory are on transparent "
                "huge pages (%s: %s); on 4 KiB pages the MXFP4 experts decode 1.3-4x more slowly "
                "(README, \"Weights in memory\"). %s",
                static_cast<double>(huge_page_bytes) / 1e9,
                static_cast<double>(bytes_in_memory) / 1e9, kThpEnabledPath, thp.c_str(),
                thp == "never" ? "Set it to madvise or always."
                               : "The kernel found too few free 2 MiB pages, or THP is disabled "
                                 "for this process; loading with more memory free may help.");
  return line;
}

size_t smaps_field_bytes(std::string_view smaps, std::span<const AddressRange> ranges,
                         std::string_view field) {
  const auto parse_hex = [](std::string_view s, uintptr_t& v) {
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
    return ec == std::errc() && p == s.data() + s.size();
  };
  size_t total = 0;
  size_t overlap = 0;  // of the current mapping with `ranges`
  while (!smaps.empty()) {
    const size_t eol = smaps.find('\n');
    const std::string_view line = smaps.substr(0, eol);
    smaps.remove_prefix(eol == std::string_view::npos ? smaps.size() : eol + 1);
    // A mapping's header: "begin-end perms offset dev inode [path]"; its fields follow it.
    const size_t dash = line.find('-'), space = line.find(' ');
    uintptr_t begin = 0, end = 0;
    if (dash != std::string_view::npos && space != std::string_view::npos && dash < space &&
        parse_hex(line.substr(0, dash), begin) &&
        parse_hex(line.substr(dash + 1, space - dash - 1), end)) {
      overlap = 0;
      for (const AddressRange& r : ranges) {
        const uintptr_t lo = std::max(begin, r.begin), hi = std::min(end, r.end);
        if (lo < hi) overlap += hi - lo;
      }
      continue;
    }
    if (overlap == 0 || line.size() <= field.size() || line.substr(0, field.size()) != field ||
        line[field.size()] != ':')
      continue;
    std::string_view value = line.substr(field.size() + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    size_t kb = 0;
    const auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), kb);
    if (ec != std::errc() || std::string_view(p, value.data() + value.size()) != " kB") continue;
    total += std::min(kb * 1024, overlap);
  }
  return total;
}

}  // namespace attnres
