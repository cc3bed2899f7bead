// StateMemory (util/memory.h): aligned, disjoint blocks reused by size, in mappings advised as
// transparent huge pages, behind a std allocator.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "util/memory.h"

namespace attnres {
namespace {

// The VmFlags line of the mapping of /proc/self/smaps that holds address p ("" if none).
std::string vm_flags_at(const void* p) {
  std::ifstream in("/proc/self/smaps");
  std::string line;
  bool inside = false;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(in, line)) {
    unsigned long begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= a && a < end;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(StateMemory, BlocksAreAlignedDisjointAndReusedBySize) {
  StateMemory& m = StateMemory::instance();
  const size_t sizes[] = {100, 4096, size_t{512} << 10, 100};
  std::vector<std::pair<std::byte*, size_t>> blocks;
  for (size_t s : sizes) {
    auto* p = static_cast<std::byte*>(m.allocate(s));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    std::memset(p, 0x5a, s);
    blocks.emplace_back(p, s);
  }
  for (size_t i = 0; i < blocks.size(); ++i)
    for (size_t j = i + 1; j < blocks.size(); ++j) {
      const auto [a, na] = blocks[i];
      const auto [b, nb] = blocks[j];
      EXPECT_TRUE(a + na <= b || b + nb <= a) << i << " overlaps " << j;
    }
  // A released block is handed out again for its size, and only for its size.
  m.release(blocks[2].first, blocks[2].second);
  void* other = m.allocate(4096);
  EXPECT_NE(other, blocks[2].first);
  void* again = m.allocate(size_t{512} << 10);
  EXPECT_EQ(again, blocks[2].first);
  m.release(other, 4096);
  m.release(again, size_t{512} << 10);
  for (size_t i : {0u, 1u, 3u}) m.release(blocks[i].first, blocks[i].second);
}

TEST(StateMemory, MappingsAreAdvisedAsHugePages) {
  // "hg" in VmFlags: the mapping has MADV_HUGEPAGE, so the kernel may back its 2 MiB ranges with
  // huge pages (whether it does depends on free memory; the advice is what we control).
  if (thp_setting() == "unreadable") GTEST_SKIP() << "this kernel has no transparent huge pages";
  const size_t bytes = size_t{4} << 20;
  void* p = StateMemory::instance().allocate(bytes);
  std::memset(p, 1, bytes);
  const std::string flags = vm_flags_at(p);
  ASSERT_FALSE(flags.empty()) << "no mapping holds the block";
  std::istringstream words(flags);
  std::set<std::string> set;
  for (std::string w; words >> w;) set.insert(w);
  EXPECT_TRUE(set.count("hg")) << flags;
  StateMemory::instance().release(p, bytes);
}

TEST(StateMemory, BacksStdContainers) {
  std::vector<float, StateAllocator<float>> a(1000, 1.5f), b;
  b = a;
  b.resize(5000, 2.0f);
  EXPECT_EQ(a.size(), 1000u);
  EXPECT_EQ(b[999], 1.5f);
  EXPECT_EQ(b[4999], 2.0f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
}

#if defined(__SANITIZE_ADDRESS__)
TEST(StateMemoryDeathTest, AddressSanitizerSeesOverrunsAndUseAfterRelease) {
  EXPECT_DEATH(
      {
        auto* p = static_cast<volatile char*>(StateMemory::instance().allocate(128));
        p[128] = 1;
      },
      "AddressSanitizer");
  EXPECT_DEATH(
      {
        auto* p = static_cast<volatile char*>(StateMemory::instance().allocate(256));
        StateMemory::instance().release(const_cast<char*>(p), 256);
        p[0] = 1;
      },
      "AddressSanitizer");
}
#endif

}  // namespace
}  // namespace attnres
