// STREAM probe: runs on small arrays (fast, ASan-friendly), checks its own results and reports
// positive bandwidths; bad options are refused with kInvalidArgument. The real numbers come from
// bench/stream_bench.cpp on full-size arrays (docs/kernels.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/stream_probe.h"

namespace attnres {
namespace {

TEST(StreamProbe, SmallArraysVerifyAndReportBandwidth) {
  StreamOptions o;
  o.array_bytes = 256 << 10;
  o.reps = 2;
  o.threads = 2;
  const Result<StreamResult> r = stream_probe(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->array_bytes, size_t{256} << 10);
  EXPECT_EQ(r->threads, 2);
  EXPECT_EQ(r->reps, 2);
  for (double gb_s : {r->copy_gb_s, r->triad_gb_s, r->read_gb_s}) {
    EXPECT_TRUE(std::isfinite(gb_s));
    EXPECT_GT(gb_s, 0.0);
  }
}

TEST(StreamProbe, ReadPassSumsWordsWithAnyThreadCount) {
  // 1000 words plus 5 tail bytes, unaligned start: sum of words + tail bytes, mod 2^64.
  std::vector<std::byte> buf(8 * 1000 + 5 + 3);
  const std::byte* data = buf.data() + 3;
  uint64_t expect = 0;
  for (size_t i = 0; i < 1000; ++i) {
    const uint64_t w = 0x0123456789abcdefull * (i + 1);
    std::memcpy(buf.data() + 3 + 8 * i, &w, 8);
    expect += w;
  }
  for (size_t i = 0; i < 5; ++i) {
    buf[3 + 8000 + i] = static_cast<std::byte>(200 + i);
    expect += 200 + i;
  }
  for (int threads : {1, 2, 3}) EXPECT_EQ(stream_read_pass(data, 8005, threads), expect) << threads;
}

TEST(StreamProbe, RejectsBadOptions) {
  StreamOptions o;
  o.array_bytes = 1 << 20;
  o.reps = 0;
  EXPECT_EQ(stream_probe(o).status().code(), ErrorCode::kInvalidArgument);
  o.reps = 1;
  o.array_bytes = 100;
  EXPECT_EQ(stream_probe(o).status().code(), ErrorCode::kInvalidArgument);
}

// The sustained figure runs whole passes until the time is up (at least one, checked against the
// word sum of the array it wrote) and reports a finite rate; a non-positive time is refused.
TEST(StreamProbe, SustainedReadRunsPassesAndRefusesBadTime) {
  const Result<double> r = sustained_read_gb_s(0.01, 2);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_TRUE(std::isfinite(*r));
  EXPECT_GT(*r, 0.0);
  for (double bad : {0.0, -1.0, std::nan("")})
    EXPECT_EQ(sustained_read_gb_s(bad, 2).status().code(), ErrorCode::kInvalidArgument) << bad;
}

TEST(StreamProbe, LastLevelCacheIsPlausible) {
  const size_t llc = last_level_cache_bytes();
  EXPECT_GE(llc, size_t{256} << 10);
  EXPECT_LE(llc, size_t{4} << 30);
}

}  // namespace
}  // namespace attnres
