#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
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

// The published config with `edit` applied to its text_config.
Result<ModelConfig> k3_with(const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(read_file(kK3Config));
  edit(j["text_config"]);
  return parse_model_config(j.dump(), "edited.json");
}

// 1-based layer lists for L layers: MLA at every 4th layer and the last, KDA elsewhere.
void set_layers(nlohmann::json& tc, int L) {
  nlohmann::json full = nlohmann::json::array(), kda = nlohmann::json::array();
  for (int l = 1; l <= L; ++l) (l % 4 == 0 || l == L ? full : kda).push_back(l);
  tc["num_hidden_layers"] = L;
  tc["linear_attn_config"]["full_attn_layers"] = full;
  tc["linear_attn_config"]["kda_layers"] = kda;
}

// The fused AttnRes step holds at most kMaxAttnResSources sources (an assert only in the
// kernel): 64 layers with block 1 read 65 at the final read and used to pass validation and
// segfault in run.
TEST(ConfigLimits, AttnResSourcesBeyondTheKernelTablesAreRefused) {
  for (int L : {63, 64, 93}) {
    auto c = k3_with([&](nlohmann::json& tc) {
      set_layers(tc, L);
      tc["attn_res_block_size"] = 1;
    });
    if (L + 1 <= kMaxAttnResSources) {
      ASSERT_TRUE(c.is_ok()) << c.status().to_string();
      EXPECT_EQ(c->schedule.max_sources, kMaxAttnResSources);
      continue;
    }
    ASSERT_FALSE(c.is_ok()) << L;
    EXPECT_EQ(c.status().code(), ErrorCode::kUnsupported);
    const std::string& m = c.status().message();
    EXPECT_NE(m.find("attn_res_block_size"), std::string::npos) << m;
    EXPECT_NE(m.find("num_hidden_layers " + std::to_string(L)), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(L + 1) + " sources"), std::string::npos) << m;
    EXPECT_NE(m.find("at most 64"), std::string::npos) << m;
  }
  // The smallest block that fits is accepted.
  auto ok = k3_with([](nlohmann::json& tc) { tc["attn_res_block_size"] = 2; });
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->schedule.max_sources, 48);
}

// get<int>() wraps: 4294967389 layers used to read as 93 and load the published schedule.
TEST(ConfigLimits, IntegersOutsideTheirFieldTypeAreRefused) {
  auto c = k3_with([](nlohmann::json& tc) { tc["num_hidden_layers"] = 4294967389LL; });
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kInvalidValue);
  EXPECT_NE(c.status().message().find("'text_config.num_hidden_layers' is 4294967389"),
            std::string::npos)
      << c.status().message();
  auto list = k3_with([](nlohmann::json& tc) {
    tc["linear_attn_config"]["full_attn_layers"][0] = 4294967300LL;  // 4 after wrapping
  });
  ASSERT_FALSE(list.is_ok());
  EXPECT_NE(list.status().message().find("full_attn_layers' contains 4294967300"),
            std::string::npos)
      << list.status().message();
  auto neg = k3_with([](nlohmann::json& tc) { tc["num_attention_heads"] = -18446744073709LL; });
  ASSERT_FALSE(neg.is_ok());
  EXPECT_NE(neg.status().message().find("num_attention_heads"), std::string::npos);
}

// Sizes feed allocations and products everywhere downstream (`plan` printed negative byte
// counts for a huge hidden_size): each is bounded at load, naming the field and the bound.
TEST(ConfigLimits, SizesAreBoundedAbove) {
  struct Case {
    std::string field;
    nlohmann::json value;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"hidden_size", 1000000000000000LL,
       "'text_config.hidden_size' is 1000000000000000, expected 1..1048576"},
      {"vocab_size", 4294967296LL,
       "'text_config.vocab_size' is 4294967296, expected 1..2147483647"},
      {"intermediate_size", 1 << 21, "intermediate_size' is 2097152, expected 1..1048576"},
      {"num_attention_heads", 1 << 21, "num_attention_heads' is 2097152"},
      {"kv_lora_rank", 1 << 21, "kv_lora_rank' is 2097152"},
      {"q_lora_rank", -3, "q_lora_rank' is -3, expected 0..1048576"},
      {"num_experts", 100000, "num_experts' is 100000, expected 1..65536"},
      {"num_shared_experts", 100000, "num_shared_experts' is 100000, expected 0..65536"},
      {"moe_intermediate_size", 1 << 21, "moe_intermediate_size' is 2097152"},
  };
  for (const Case& k : cases) {
    auto c = k3_with([&](nlohmann::json& tc) { tc[k.field] = k.value; });
    ASSERT_FALSE(c.is_ok()) << k.field;
    EXPECT_EQ(c.status().code(), ErrorCode::kInvalidValue) << k.field;
    EXPECT_NE(c.status().message().find(k.expect), std::string::npos) << c.status().message();
  }
}

// The KDA convolution's window lives in fixed tables of kMaxConvWidth: a width of 17 used to
// give silently wrong output and 200 a segfault.
TEST(ConfigLimits, ConvolutionWidthBeyondTheKernelTablesIsRefused) {
  auto at = [](int w) {
    return k3_with(
        [&](nlohmann::json& tc) { tc["linear_attn_config"]["short_conv_kernel_size"] = w; });
  };
  EXPECT_TRUE(at(kMaxConvWidth).is_ok());
  auto c = at(kMaxConvWidth + 1);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("short_conv_kernel_size' is 17, expected 1..16"),
            std::string::npos)
      << c.status().message();
}

TEST(ConfigLimits, FloatsMustBeFiniteAndTokenIdsInsideTheVocabulary) {
  // 1e39 is a finite double but infinite as the float the engine uses.
  auto eps = k3_with([](nlohmann::json& tc) { tc["rms_norm_eps"] = 1e39; });
  ASSERT_FALSE(eps.is_ok());
  EXPECT_NE(
      eps.status().message().find("rms_norm_eps' is inf as a float, expected a finite number > 0"),
      std::string::npos)
      << eps.status().message();
  auto scale = k3_with([](nlohmann::json& tc) { tc["routed_scaling_factor"] = -1e300; });
  ASSERT_FALSE(scale.is_ok());
  EXPECT_NE(scale.status().message().find("routed_scaling_factor"), std::string::npos);
  auto eos = k3_with([](nlohmann::json& tc) { tc["eos_token_id"] = 163840; });
  ASSERT_FALSE(eos.is_ok());
  EXPECT_NE(eos.status().message().find("eos_token_id' is 163840, expected a token id in "
                                        "0..163839 (vocab_size 163840)"),
            std::string::npos)
      << eos.status().message();
}

// A FIFO named config.json used to block the loader forever waiting for a writer.
TEST(ConfigLimits, ConfigFileMustBeARegularFile) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("attnres_cfg_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string fifo = (dir / "config.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  auto c = load_model_config(fifo);
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), ErrorCode::kIoError);
  EXPECT_NE(c.status().message().find("config file is a FIFO, expected a regular file"),
            std::string::npos)
      << c.status().message();
  auto d = load_model_config(dir.string());
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().message().find("is a directory"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace attnres
