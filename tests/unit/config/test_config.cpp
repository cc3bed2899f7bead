#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "config/config.h"

namespace attnres {
namespace {

const std::string kK3Config = std::string(ATTNRES_FIXTURES_DIR) + "/kimi-k3-config.json";

std::string read_file(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Config, PublishedKimiK3Schedule) {
  auto c = load_model_config(kK3Config);
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  const LayerSchedule& s = c->schedule;
  EXPECT_EQ(c->hidden_size, 7168);
  ASSERT_EQ(s.num_layers(), 93);
  EXPECT_EQ(s.num_mla, 24);
  EXPECT_EQ(s.num_kda, 69);
  std::vector<int> mla;
  for (const auto& l : s.layers)
    if (l.attention == AttnKind::kMla) mla.push_back(l.index);
  std::vector<int> expect_mla;
  for (int i = 3; i <= 91; i += 4) expect_mla.push_back(i);
  expect_mla.push_back(92);
  EXPECT_EQ(mla, expect_mla);
  EXPECT_EQ(s.layers[0].ffn, FfnKind::kDense);
  for (int i = 1; i < 93; ++i) EXPECT_EQ(s.layers[i].ffn, FfnKind::kMoe) << i;
  EXPECT_EQ(s.bank_slots, 8);
  EXPECT_EQ(s.commit_layers, (std::vector<int>{0, 12, 24, 36, 48, 60, 72, 84}));
  EXPECT_EQ(s.layers[84].commit_slot, 7);
  for (int i = 0; i < 93; ++i) {
    if (i % 12 == 0)
      EXPECT_EQ(s.layers[i].commit_slot, i / 12);
    else
      EXPECT_FALSE(s.layers[i].commit_slot.has_value());
  }
  EXPECT_EQ(s.max_sources, 9);
  EXPECT_EQ(s.final_sources, 9);
  EXPECT_EQ(s.num_reads(), 186);
  EXPECT_EQ(s.layers[0].pre_attn_sources, 0);  // read skipped
  EXPECT_EQ(s.layers[1].pre_attn_sources, 2);
  EXPECT_EQ(s.layers[12].pre_attn_sources, 2);  // before commit of slot 1
  EXPECT_EQ(s.layers[12].pre_mlp_sources, 3);
  EXPECT_EQ(s.layers[84].pre_mlp_sources, 9);
  EXPECT_EQ(c->expert_format, ExpertFormat::kMxfp4);
  EXPECT_EQ(c->routed_expert_hidden_size, 3584);
  EXPECT_FLOAT_EQ(*c->linear.gate_lower_bound, -5.0f);
  EXPECT_EQ(c->eos_token_id, 163586);
}

TEST(Config, GoldenTinySchedules) {
  auto a = load_model_config(std::string(ATTNRES_FIXTURES_DIR) + "/golden/tiny-a/config.json");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->schedule.bank_slots, 5);
  EXPECT_EQ(a->schedule.commit_layers, (std::vector<int>{0, 3, 6, 9, 12}));
  std::vector<int> mla;
  for (const auto& l : a->schedule.layers)
    if (l.attention == AttnKind::kMla) mla.push_back(l.index);
  EXPECT_EQ(mla, (std::vector<int>{3, 7, 11, 12}));
  auto b = load_model_config(std::string(ATTNRES_FIXTURES_DIR) + "/golden/tiny-b/config.json");
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->schedule.bank_slots, 3);
  EXPECT_EQ(b->schedule.commit_layers, (std::vector<int>{0, 4, 8}));
  EXPECT_EQ(b->linear.num_heads, 6);
  EXPECT_EQ(b->num_attention_heads, 8);
}

// Known misreading: 1-based layer lists read as 0-based would put MLA at layers 4, 8, ...
TEST(Config, LayerListsAreOneBased) {
  auto c = load_model_config(kK3Config);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->schedule.layers[3].attention, AttnKind::kMla);
  EXPECT_EQ(c->schedule.layers[4].attention, AttnKind::kKda);
  EXPECT_EQ(c->schedule.layers[0].attention, AttnKind::kKda);
}

// Known misreading: block counted in sublayers would commit every 6 layers.
TEST(Config, BlockCountedInLayers) {
  LayerSchedule s = attnres_schedule(93, 12);
  EXPECT_FALSE(s.layers[6].commit_slot.has_value());
  EXPECT_EQ(s.layers[12].commit_slot, 1);
}

TEST(Config, PlainResidualModelLoads) {
  auto j = nlohmann::json::parse(read_file(kK3Config));
  j["text_config"].erase("attn_res_block_size");
  auto c = parse_model_config(j.dump(), "plain.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_FALSE(c->schedule.has_attnres());
  EXPECT_EQ(c->schedule.bank_slots, 0);
  EXPECT_EQ(c->schedule.num_reads(), 0);
  for (const auto& l : c->schedule.layers) EXPECT_FALSE(l.commit_slot.has_value());
}

TEST(Config, BareTextConfigLoads) {
  auto j = nlohmann::json::parse(read_file(kK3Config));
  auto c = parse_model_config(j["text_config"].dump(), "bare.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->schedule.bank_slots, 8);
}

TEST(Config, ScheduleSourcesFormula) {
  for (int L = 1; L <= 40; ++L) {
    for (int B = 1; B <= 13; ++B) {
      LayerSchedule s = attnres_schedule(L, B);
      EXPECT_EQ(s.bank_slots, (L + B - 1) / B);
      int committed = 0;
      for (int i = 0; i < L; ++i) {
        EXPECT_EQ(s.layers[i].pre_attn_sources, i == 0 ? 0 : committed + 1);
        if (s.layers[i].commit_slot) ++committed;
        EXPECT_EQ(s.layers[i].pre_mlp_sources, committed + 1);
      }
      EXPECT_EQ(committed, s.bank_slots);
    }
  }
}

}  // namespace
}  // namespace attnres
