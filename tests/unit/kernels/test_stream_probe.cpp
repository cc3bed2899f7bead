// STREAM probe: runs on small arrays (fast, ASan-friendly), checks its own results and reports
// positive bandwidths; bad options are refused with kInvalidArgument. The real numbers come from
// bench/stream_bench.cpp on full-size arrays (docs/kernels.md).
#include <gtest/gtest.h>

#include <cmath>

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

TEST(StreamProbe, RejectsBadOptions) {
  StreamOptions o;
  o.array_bytes = 1 << 20;
  o.reps = 0;
  EXPECT_EQ(stream_probe(o).status().code(), ErrorCode::kInvalidArgument);
  o.reps = 1;
  o.array_bytes = 100;
  EXPECT_EQ(stream_probe(o).status().code(), ErrorCode::kInvalidArgument);
}

TEST(StreamProbe, LastLevelCacheIsPlausible) {
  const size_t llc = last_level_cache_bytes();
  EXPECT_GE(llc, size_t{256} << 10);
  EXPECT_LE(llc, size_t{4} << 30);
}

}  // namespace
}  // namespace attnres
