#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "config/config.h"
#include "io/weights.h"
#include "synth/synth.h"
#include "tokenizer/tokenizer.h"

namespace attnres {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() /
               ("attnres_synth_" + name + "_" +
                std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  fs::remove_all(p);
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Synth, SpecsMatchGoldenCheckpoints) {
  for (const char* name : {"tiny-a", "tiny-b"}) {
    const std::string dir = std::string(ATTNRES_FIXTURES_DIR) + "/golden/" + name;
    auto w = load_model(dir);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    const auto specs = model_tensor_specs(w->config);
    EXPECT_EQ(static_cast<int64_t>(specs.size()), w->report.tensors_bound) << name;
    EXPECT_EQ(w->report.extra_tensors, 0) << name;
  }
}

TEST(Synth, TinyPresetBindsAndIsDeterministic) {
  auto preset = synth_preset("tiny");
  ASSERT_TRUE(preset.is_ok());
  const fs::path a = temp_dir("a"), b = temp_dir("b"), c = temp_dir("c");
  auto ra = write_synthetic_model(*preset, a.string(), 7);
  ASSERT_TRUE(ra.is_ok()) << ra.status().to_string();
  auto w = load_model(a.string());
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(w->report.extra_tensors, 0);
  EXPECT_EQ(w->report.tensors_bound, ra->tensors);
  const LayerSchedule& s = w->config.schedule;
  EXPECT_GE(s.bank_slots, 3);
  EXPECT_NE(s.num_layers() % s.block_size, 0) << "final block must be partial";
  EXPECT_EQ(w->config.expert_format, ExpertFormat::kMxfp4);
  // A_log ships padded to head_dim with zeros, as the release does.
  const KdaWeights& kda = *w->layers[0].kda;
  EXPECT_GT(kda.a_log_stored.numel(), static_cast<int64_t>(kda.a_log.size()));
  for (int64_t i = static_cast<int64_t>(kda.a_log.size()); i < kda.a_log_stored.numel(); ++i)
    EXPECT_EQ(kda.a_log_stored.get_f32(i), 0.0f);

  // The byte-level tokenizer in Kimi's layout: control ids right after the ranks, the stop
  // token is the config's eos.
  auto tok = Tokenizer::load((a / "tiktoken.model").string(), PreTokenizer::kKimi);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  EXPECT_EQ(tok->vocab_size(), w->config.vocab_size);
  EXPECT_EQ(tok->special_id("<|end_of_msg|>"), w->config.eos_token_id);
  EXPECT_EQ(tok->special_id("[BOS]"), w->config.bos_token_id);
  auto ids = tok->encode("hello, world", false);
  ASSERT_TRUE(ids.is_ok());
  EXPECT_EQ(*tok->decode(*ids), "hello, world");

  ASSERT_TRUE(write_synthetic_model(*preset, b.string(), 7).is_ok());
  ASSERT_TRUE(write_synthetic_model(*preset, c.string(), 8).is_ok());
  EXPECT_EQ(slurp(a / "model.safetensors"), slurp(b / "model.safetensors"));
  EXPECT_NE(slurp(a / "model.safetensors"), slurp(c / "model.safetensors"));
  EXPECT_EQ(slurp(a / "config.json"), slurp(c / "config.json"));

  // An existing checkpoint is never overwritten without being asked to.
  const std::string before = slurp(a / "model.safetensors");
  auto again = write_synthetic_model(*preset, a.string(), 9);
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(again.status().message().find("--overwrite"), std::string::npos);
  EXPECT_EQ(slurp(a / "model.safetensors"), before);
  for (const auto& p : {a, b, c}) fs::remove_all(p);
}

TEST(Synth, K3MiniPresetHasTheK3Graph) {
  auto preset = synth_preset("k3-mini");
  ASSERT_TRUE(preset.is_ok());
  nlohmann::json root = {{"text_config", preset->text_config}};
  auto cfg = parse_model_config(root.dump(), "k3-mini");
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  const LayerSchedule& s = cfg->schedule;
  EXPECT_GE(s.bank_slots, 3);  // at least two full blocks after the embedding slot
  EXPECT_NE(s.num_layers() % s.block_size, 0);
  EXPECT_GT(s.num_mla, 0);
  EXPECT_GT(s.num_kda, 0);
  EXPECT_EQ(s.layers[0].ffn, FfnKind::kDense);
  EXPECT_EQ(s.layers.back().attention, AttnKind::kMla);
  EXPECT_EQ(cfg->expert_format, ExpertFormat::kMxfp4);
  // Weight bytes by formula: roughly 1-3 GB.
  int64_t bytes = 0;
  for (const auto& spec : model_tensor_specs(*cfg)) {
    int64_t n = 1;
    for (int64_t v : spec.shape) n *= v;
    bytes += spec.u8 ? n : 2 * n;
  }
  EXPECT_GT(bytes, int64_t{1} << 30);
  EXPECT_LT(bytes, int64_t{3} << 30);
}

TEST(Synth, UnknownPresetIsAnError) {
  auto p = synth_preset("k3-huge");
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.status().message().find("k3-huge"), std::string::npos);
  EXPECT_NE(p.status().message().find("k3-mini"), std::string::npos);
}

}  // namespace
}  // namespace attnres
