// Program, policies and verifier (plan/program.h, plan/plan.h).
#include <gtest/gtest.h>

#include <random>

#include "config/config.h"
#include "plan/plan.h"
#include "plan/program.h"

namespace attnres {
namespace {

Program published() {
  return build_program(attnres_schedule(93, 12));
}

std::vector<Hazard> hazards_of(const Program& p, Policy policy) {
  auto r = verify_plan(p, make_plan(p, policy));
  EXPECT_TRUE(r.is_ok()) << r.status().to_string();
  return r.is_ok() ? *r : std::vector<Hazard>{};
}

// "L<layer><suffix>" (built with += : GCC 12 warns falsely on chained string operator+).
std::string step_of(int layer, const char* suffix) {
  std::string s = "L";
  s += std::to_string(layer);
  s += suffix;
  return s;
}

TEST(Program, PublishedShape) {
  const Program p = published();
  EXPECT_EQ(p.bank_slots, 8);
  ASSERT_EQ(p.committed.size(), 8u);
  // 2 reads per layer + final; the layer-0 pre-attention read is the one-source norm.
  int reads = 0, max_sources = 0;
  for (const Step& s : p.steps) {
    if (!s.is_read()) continue;
    ++reads;
    max_sources = std::max(max_sources, static_cast<int>(s.slot_sources.size()) + 1);
  }
  EXPECT_EQ(reads, 2 * 93 + 1);
  EXPECT_EQ(max_sources, 9);
  // Slot 7 is committed at layer 84, read by L84.pre_mlp .. L92.pre_mlp and the final read.
  const Value& s7 = p.values[static_cast<size_t>(p.committed[7])];
  EXPECT_EQ(s7.layer, 84);
  EXPECT_EQ(p.step_name(s7.def_step), "L84.pre_attn");
  EXPECT_EQ(p.step_name(s7.readers.front()), "L84.pre_mlp");
  EXPECT_EQ(p.step_name(s7.readers.back()), "final");
  EXPECT_EQ(s7.readers.size(), 2u * 9u - 1u + 1u);  // 84 pre_mlp, 85..92 both reads, final
}

TEST(Verifier, UnrestrictedHasExactlyTheLayer84Hazard) {
  const Program p = published();
  const auto h = hazards_of(p, Policy::kUnrestricted);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].layer, 84);
  EXPECT_EQ(h[0].step_name, "L84.pre_mlp");
  EXPECT_EQ(h[0].storage_name, "slot7");
  EXPECT_EQ(h[0].victim_name, "bank[7]");
  std::vector<std::string> expect = {"L84.pre_mlp"};
  for (int i = 85; i <= 92; ++i) {
    expect.push_back(step_of(i, ".pre_attn"));
    expect.push_back(step_of(i, ".pre_mlp"));
  }
  expect.push_back("final");
  EXPECT_EQ(h[0].reader_names, expect);
}

TEST(Verifier, PreserveFinalPlannedSeparateAreClean) {
  const Program p = published();
  EXPECT_TRUE(hazards_of(p, Policy::kPreserveFinal).empty());
  EXPECT_TRUE(hazards_of(p, Policy::kPlanned).empty());
  EXPECT_TRUE(hazards_of(p, Policy::kSeparate).empty());
}

TEST(Planner, PublishedBuffers) {
  const Program p = published();
  const int lb = lower_bound_buffers(p);
  EXPECT_EQ(lb, 10);  // 8 slots + the final block's running sum + the pending MLP output
  const Plan planned = make_plan(p, Policy::kPlanned);
  EXPECT_EQ(planned.num_storages(), lb);
  EXPECT_EQ(peak_live_storages(p, planned), lb);
  EXPECT_EQ(make_plan(p, Policy::kUnrestricted).num_storages(), 9);  // below the bound: unsafe
  EXPECT_EQ(make_plan(p, Policy::kPreserveFinal).num_storages(), 10);
  EXPECT_GT(make_plan(p, Policy::kSeparate).num_storages(), lb);
}

}  // namespace
}  // namespace attnres
