// Session and `attnres run`: greedy generation through the runtime (planned executor, chunked
// prefill, one-token decode) reproduces the golden tokens and logits; the CLI's logit dump has
// the documented layout; repeated generation does not allocate.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../model/golden_util.h"
#include "runtime/session.h"

namespace attnres {
namespace {

using testing::golden;

SessionOptions f32_session(int64_t chunk, bool planned = true) {
  SessionOptions o;
  o.forward.act = ActDType::kF32;
  o.chunk_size = chunk;
  o.planned = planned;
  return o;
}

TEST(Session, GreedyGenerationMatchesGolden) {
  struct Run {
    const char* set;
    int c;
  };
  for (const Run& run : {Run{"tiny-a", 1}, Run{"tiny-b", 3}}) {
    const char* set = run.set;
    const testing::GoldenSet& g = golden(set);
    {
      const int c = run.c;
      const std::string p = "case" + std::to_string(c) + ".";
      const std::vector<int32_t> prompt = g.ids(p + "prompt_ids");
      const std::vector<int32_t> greedy = g.ids(p + "greedy_ids");
      auto s = Session::create(g.weights, f32_session(/*chunk=*/24));  // 100 = 4 x 24 + 4
      ASSERT_TRUE(s.is_ok()) << s.status().to_string();
      auto r = generate_greedy(**s, prompt, static_cast<int64_t>(greedy.size()), -1, true);
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      EXPECT_EQ(r->generated, greedy) << set << " case " << c;
      EXPECT_LT(testing::max_abs_diff(r->prefill_logits, g.floats(p + "prefill_logits")), 2e-3f);
      EXPECT_LT(testing::max_abs_diff(r->decode_logits, g.floats(p + "decode_logits")), 2e-3f);
      EXPECT_EQ((*s)->position(), static_cast<int64_t>(prompt.size() + greedy.size() - 1));
    }
  }
}

TEST(Session, ReferenceAndPlannedSessionsAgree) {
  const testing::GoldenSet& g = golden("tiny-b");
  const std::vector<int32_t> prompt = g.ids("case2.prompt_ids");
  std::vector<float> last[2];
  for (int planned = 0; planned < 2; ++planned) {
    auto s = Session::create(g.weights, f32_session(10, planned == 1));
    ASSERT_TRUE(s.is_ok());
    ASSERT_TRUE((*s)->prefill(prompt, false, last[planned]).is_ok());
    ASSERT_EQ(last[planned].size(), static_cast<size_t>(g.weights.config.vocab_size));
  }
  EXPECT_LT(testing::max_abs_diff(last[0], last[1]), 1e-4f);
  const std::vector<float> want = g.floats("case2.prefill_logits");
  EXPECT_LT(testing::max_abs_diff(last[1].data(), want.data() + want.size() - last[1].size(),
                                  last[1].size()),
            2e-3f);
}

TEST(Session, RepeatedGenerationDoesNotAllocateInTheArena) {
  const testing::GoldenSet& g = golden("tiny-a");
  const std::vector<int32_t> prompt = g.ids("case1.prompt_ids");
  auto s = Session::create(g.weights, f32_session(8));
  ASSERT_TRUE(s.is_ok());
  ASSERT_TRUE(generate_greedy(**s, prompt, 8, -1, false).is_ok());
  const int64_t before = (*s)->arena().heap_allocations();
  (*s)->reset();
  ASSERT_TRUE(generate_greedy(**s, prompt, 8, -1, false).is_ok());
  EXPECT_EQ((*s)->arena().heap_allocations(), before);
}

// The default bf16 flow with an fp8 latent cache: finite logits, and two sessions give the
// same tokens and bitwise the same logits (no hidden state outside the session).
TEST(Session, Bf16WithFp8CacheIsDeterministic) {
  const testing::GoldenSet& g = golden("tiny-b");
  const std::vector<int32_t> prompt = g.ids("case1.prompt_ids");
  SessionOptions o;
  o.forward.kv = KvCacheDtype::kFP8;
  o.chunk_size = 4;
  GenerateResult r[2];
  for (auto& out : r) {
    auto s = Session::create(g.weights, o);
    ASSERT_TRUE(s.is_ok());
    auto res = generate_greedy(**s, prompt, 6, -1, true);
    ASSERT_TRUE(res.is_ok()) << res.status().to_string();
    out = std::move(res).value();
  }
  EXPECT_EQ(r[0].generated, r[1].generated);
  EXPECT_EQ(r[0].decode_logits, r[1].decode_logits);
  EXPECT_EQ(r[0].decode_logits.size(), 6u * static_cast<size_t>(g.weights.config.vocab_size));
  for (float x : r[0].decode_logits) ASSERT_TRUE(std::isfinite(x));
}

// Projection stats (what `attnres bench` splits decode time with): one decode step reads each
// chosen expert's three matrices once per MoE layer (top-k distinct experts, all the same
// shape), so its MXFP4 bytes are known exactly; the dense bytes and batch count are the same
// for every decode step, and wall time is added for both kinds.
TEST(Session, ProjectionStatsCountEveryDecodeStep) {
  int mxfp4_sets = 0;
  for (const char* set : {"tiny-a", "tiny-b"}) {
    const testing::GoldenSet& g = golden(set);
    const ModelConfig& c = g.weights.config;
    int64_t mxfp4_per_step = 0;
    for (const LayerWeights& l : g.weights.layers) {
      if (!l.moe) continue;
      const ExpertWeights& e = l.moe->experts.front();
      for (const ExpertMatrix* m : {&e.w1, &e.w2, &e.w3})
        mxfp4_per_step += m->mxfp4 ? static_cast<int64_t>(m->packed.nbytes + m->scale.nbytes) : 0;
    }
    mxfp4_per_step *= c.num_experts_per_token;
    SessionOptions o;
    o.forward.act = ActDType::kBF16;
    auto s = Session::create(g.weights, o);
    ASSERT_TRUE(s.is_ok()) << s.status().to_string();
    std::vector<float> logits;
    ASSERT_TRUE((*s)->prefill(g.ids("case1.prompt_ids"), false, logits).is_ok());
    std::vector<float> row(static_cast<size_t>(c.vocab_size));
    ProjectionStats prev = (*s)->projection_stats(), step[2];
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE((*s)->decode(1 + i, row).is_ok());
      const ProjectionStats& now = (*s)->projection_stats();
      step[i].dense_bytes = now.dense_bytes - prev.dense_bytes;
      step[i].mxfp4_bytes = now.mxfp4_bytes - prev.mxfp4_bytes;
      step[i].batches = now.batches - prev.batches;
      EXPECT_GT(now.dense_seconds, prev.dense_seconds) << set;
      if (mxfp4_per_step > 0) {
        EXPECT_GT(now.mxfp4_seconds, prev.mxfp4_seconds) << set;
      }
      prev = now;
    }
    EXPECT_EQ(step[0].mxfp4_bytes, mxfp4_per_step) << set;
    EXPECT_EQ(step[1].mxfp4_bytes, mxfp4_per_step) << set;
    EXPECT_GT(step[0].dense_bytes, 0) << set;
    EXPECT_EQ(step[0].dense_bytes, step[1].dense_bytes) << set;
    EXPECT_EQ(step[0].batches, step[1].batches) << set;
    mxfp4_sets += mxfp4_per_step > 0;
  }
  EXPECT_GT(mxfp4_sets, 0) << "no golden set with MXFP4 experts: the MXFP4 count went untested";
}

TEST(Session, RejectsBadInput) {
  const testing::GoldenSet& g = golden("tiny-a");
  EXPECT_FALSE(Session::create(g.weights, f32_session(0)).is_ok());
  auto s = Session::create(g.weights, f32_session(8));
  ASSERT_TRUE(s.is_ok());
  std::vector<float> logits;
  const std::vector<int32_t> bad = {1, 2, static_cast<int32_t>(g.weights.config.vocab_size)};
  Status st = (*s)->prefill(bad, false, logits);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << st.to_string();
}

// `attnres run --dump-logits` in f32: layout and values against the golden case.
TEST(RunCli, DumpMatchesGoldenLayoutAndValues) {
  const testing::GoldenSet& g = golden("tiny-b");
  const std::vector<int32_t> prompt = g.ids("case1.prompt_ids");
  const std::vector<int32_t> greedy = g.ids("case1.greedy_ids");
  std::string ids;
  for (int32_t t : prompt) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(t);
  }
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("attnres_run_" + std::to_string(::getpid()) + ".safetensors"))
                              .string();
  const std::string cmd = std::string(ATTNRES_CLI_PATH) + " run --model " +
                          testing::golden_dir("tiny-b") + " --prompt-ids " + ids +
                          " --max-new-tokens 16 --chunk-size 5 --dtype f32 --dump-logits " + out +
                          " --json > " + out + ".json";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto f = SafetensorsFile::open(out);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const int64_t V = g.weights.config.vocab_size, P = static_cast<int64_t>(prompt.size());
  auto pre = (*f)->tensor("prefill_logits");
  auto dec = (*f)->tensor("decode_logits");
  auto tok = (*f)->tensor("tokens");
  ASSERT_TRUE(pre.is_ok() && dec.is_ok() && tok.is_ok());
  EXPECT_EQ(pre->dtype, DType::kF32);
  EXPECT_EQ(pre->shape, (std::vector<int64_t>{P, V}));
  EXPECT_EQ(dec->shape, (std::vector<int64_t>{16, V}));
  EXPECT_EQ(tok->dtype, DType::kI64);
  EXPECT_EQ(tok->shape, (std::vector<int64_t>{P + 16}));
  for (int64_t i = 0; i < P + 16; ++i)
    EXPECT_EQ(tok->as<int64_t>()[i],
              i < P ? prompt[static_cast<size_t>(i)] : greedy[static_cast<size_t>(i - P)]);
  const std::vector<float> want_pre = g.floats("case1.prefill_logits");
  const std::vector<float> want_dec = g.floats("case1.decode_logits");
  EXPECT_LT(testing::max_abs_diff(pre->as<float>(), want_pre.data(), want_pre.size()), 2e-3f);
  EXPECT_LT(testing::max_abs_diff(dec->as<float>(), want_dec.data(), want_dec.size()), 2e-3f);
  std::ifstream js(out + ".json");
  const nlohmann::json j = nlohmann::json::parse(js);
  EXPECT_EQ(j["generated"].get<std::vector<int32_t>>(), greedy);
  EXPECT_EQ(j["prompt_tokens"].get<int64_t>(), P);
  std::filesystem::remove(out);
  std::filesystem::remove(out + ".json");
}

// Default flow (bf16 activations, bf16 cache) from a prompt file: three ids on stdout.
TEST(RunCli, PromptFileWithDefaults) {
  const std::string base =
      (std::filesystem::temp_directory_path() / ("attnres_prompt_" + std::to_string(::getpid())))
          .string();
  std::ofstream(base + ".txt") << "12, 7\n300\t44\n";
  const std::string cmd = std::string(ATTNRES_CLI_PATH) + " run --model " +
                          testing::golden_dir("tiny-a") + " --prompt-file " + base +
                          ".txt --max-new-tokens 3 --ignore-eos > " + base + ".out 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream out(base + ".out");
  std::vector<int64_t> ids;
  for (int64_t v; out >> v;) ids.push_back(v);
  EXPECT_EQ(ids.size(), 3u);
  for (int64_t v : ids) EXPECT_TRUE(v >= 0 && v < golden("tiny-a").weights.config.vocab_size);
  std::filesystem::remove(base + ".txt");
  std::filesystem::remove(base + ".out");
}

TEST(RunCli, RejectsBadArguments) {
  const std::string base =
      std::string(ATTNRES_CLI_PATH) + " run --model " + testing::golden_dir("tiny-b");
  EXPECT_NE(std::system((base + " --prompt-ids 1,x,3 2>/dev/null >/dev/null").c_str()), 0);
  EXPECT_NE(std::system((base + " --prompt-ids 1,99999 2>/dev/null >/dev/null").c_str()), 0);
  EXPECT_NE(std::system((base + " 2>/dev/null >/dev/null").c_str()), 0);  // no prompt
  EXPECT_NE(std::system((base + " --prompt-ids 1 --dtype fp16 2>/dev/null >/dev/null").c_str()), 0);
}

}  // namespace
}  // namespace attnres
