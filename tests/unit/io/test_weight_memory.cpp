// WeightMemory's page report: the smaps parser, the warning's threshold, and a process with
// transparent huge pages disabled reporting none.
#include <gtest/gtest.h>
#include <sys/prctl.h>

#include <cstdlib>
#include <cstring>

#include "util/memory.h"

namespace attnres {
namespace {

constexpr const char* kSmaps =
    "7f0000000000-7f0040000000 rw-p 00000000 00:00 0 \n"
    "Size:            1048576 kB\n"
    "AnonHugePages:      4096 kB\n"
    "VmFlags: rd wr mr mw me ac sd hg\n"
    "7f0040000000-7f0040400000 rw-p 00000000 00:00 0 \n"
    "Size:               4096 kB\n"
    "AnonHugePages:      2048 kB\n"
    "7f1000000000-7f1000400000 r--p 00000000 08:01 1234    /usr/lib/x-y.so\n"
    "Size:               4096 kB\n"
    "AnonHugePages:      4096 kB\n"
    "AnonHugePages:   garbage kB\n";

TEST(WeightMemoryPages, SumsTheFieldOverMappingsInsideTheRanges) {
  // The first mapping only: 4096 kB.
  const AddressRange first[] = {{0x7f0000000000, 0x7f0040000000}};
  EXPECT_EQ(smaps_field_bytes(kSmaps, first, "AnonHugePages"), size_t{4096} << 10);
  EXPECT_EQ(smaps_field_bytes(kSmaps, first, "Size"), size_t{1} << 30);
  // Both anonymous mappings.
  const AddressRange both[] = {{0x7f0000000000, 0x7f0040400000}};
  EXPECT_EQ(smaps_field_bytes(kSmaps, both, "AnonHugePages"), size_t{6144} << 10);
  // 1 MiB of the second mapping: at most the overlap counts.
  const AddressRange part[] = {{0x7f0040000000, 0x7f0040100000}};
  EXPECT_EQ(smaps_field_bytes(kSmaps, part, "AnonHugePages"), size_t{1} << 20);
  // A range no mapping overlaps, and no ranges at all.
  const AddressRange none[] = {{0x100000, 0x200000}};
  EXPECT_EQ(smaps_field_bytes(kSmaps, none, "AnonHugePages"), 0u);
  EXPECT_EQ(smaps_field_bytes(kSmaps, {}, "AnonHugePages"), 0u);
  // The file mapping's malformed second line is skipped, its first one counts.
  const AddressRange lib[] = {{0x7f1000000000, 0x7f1000400000}};
  EXPECT_EQ(smaps_field_bytes(kSmaps, lib, "AnonHugePages"), size_t{4096} << 10);
  // A field name must match whole ("Anon" is not "AnonHugePages").
  EXPECT_EQ(smaps_field_bytes(kSmaps, both, "Anon"), 0u);
  EXPECT_EQ(smaps_field_bytes("", both, "AnonHugePages"), 0u);
}

TEST(WeightMemoryPages, WarnsForLargeWeightsMostlyOnSmallPages) {
  const int64_t mib = int64_t{1} << 20;
  EXPECT_TRUE(few_huge_pages(2600 * mib, 0));
  EXPECT_TRUE(few_huge_pages(2600 * mib, 1299 * mib));
  EXPECT_FALSE(few_huge_pages(2600 * mib, 1300 * mib));
  EXPECT_FALSE(few_huge_pages(2600 * mib, 2600 * mib));
  EXPECT_FALSE(few_huge_pages(255 * mib, 0));  // a small model
  EXPECT_FALSE(few_huge_pages(0, 0));          // --mmap: nothing read into memory
  // The warning names what was found and the setting, exactly when few_huge_pages().
  const std::string w = huge_pages_warning(2600 * mib, 0);
  EXPECT_NE(w.find("only 0.00 of the 2.73 GB"), std::string::npos) << w;
  EXPECT_NE(w.find(kThpEnabledPath), std::string::npos) << w;
  EXPECT_NE(w.find(thp_setting()), std::string::npos) << w;
  EXPECT_EQ(huge_pages_warning(2600 * mib, 2600 * mib), "");
  EXPECT_EQ(huge_pages_warning(0, 0), "");
}

// Writes `bytes` of a WeightMemory allocation and returns the huge-page bytes it reports.
size_t written_huge_page_bytes(WeightMemory& m, size_t bytes) {
  std::byte* p = m.allocate(bytes);
  std::memset(p, 1, bytes);
  return m.huge_page_bytes();
}

TEST(WeightMemoryPages, ReportsAtMostTheChunkAndNoneWithThpDisabled) {
  const size_t bytes = size_t{16} << 20;
  WeightMemory m;
  EXPECT_EQ(m.huge_page_bytes(), 0u);  // no chunk yet
  const size_t huge = written_huge_page_bytes(m, bytes);
  EXPECT_LE(huge, WeightMemory::kChunkBytes);
  EXPECT_EQ(huge % (size_t{2} << 20), 0u) << huge;
  // A process that disabled THP gets only 4 KiB pages, and the report says so.
  EXPECT_EXIT(
      {
        if (prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0) std::_Exit(2);
        WeightMemory child;
        std::_Exit(written_huge_page_bytes(child, bytes) == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(WeightMemoryPages, ThpSettingIsAModeOrUnreadable) {
  const std::string s = thp_setting();
  EXPECT_TRUE(s == "always" || s == "madvise" || s == "never" || s == "unreadable") << s;
}

}  // namespace
}  // namespace attnres
