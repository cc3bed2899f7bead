// The batched engine (include/attnres/engine.h): golden greedy generation through it, requests
// that are bitwise the same alone and sharing steps, admission errors, cancellation, bounded
// memory.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/parallel.h"

#include "engine_util.h"

namespace attnres {
namespace {

using testing::golden;
using testing::golden_model;
using testing::Outcome;
using testing::run_requests;

EngineOptions f32_engine(int64_t chunk, int max_sequences = 16) {
  EngineOptions o;
  o.activation = ActivationType::kF32;
  o.prefill_chunk = chunk;
  o.max_sequences = max_sequences;
  o.page_tokens = 8;
  return o;
}

GenerationRequest greedy(std::vector<int32_t> prompt, int64_t n) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_new_tokens = n;
  r.ignore_eos = true;
  r.keep_logits = true;
  return r;
}

TEST(Engine, GreedyGenerationMatchesGolden) {
  for (const char* set : {"tiny-a", "tiny-b"}) {
    const testing::GoldenSet& g = golden(set);
    for (int c = 0; c < g.num_cases; ++c) {
      const std::string p = "case" + std::to_string(c) + ".";
      const std::vector<int32_t> want = g.ids(p + "greedy_ids");
      auto out = run_requests(golden_model(set), f32_engine(24),
                              {greedy(g.ids(p + "prompt_ids"), static_cast<int64_t>(want.size()))});
      ASSERT_TRUE(out[0].finished);
      const GenerationResult& r = out[0].result;
      ASSERT_EQ(r.reason, FinishReason::kLength) << r.error.to_string();
      EXPECT_EQ(r.tokens, want) << set << " case " << c;
      EXPECT_LT(testing::max_abs_diff(r.prompt_logits, g.floats(p + "prefill_logits")), 2e-3f);
      EXPECT_LT(testing::max_abs_diff(r.token_logits, g.floats(p + "decode_logits")), 2e-3f);
    }
  }
}

// Random requests: prompts of 1..60 tokens, sampled with their own seeds or greedy, penalties,
// logit bias, stop tokens, lengths 1..12.
std::vector<GenerationRequest> random_requests(std::mt19937& rng, int n, int64_t vocab) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    const int64_t len = 1 + rng() % 60;
    for (int64_t t = 0; t < len; ++t) r.prompt.push_back(static_cast<int32_t>(rng() % vocab));
    r.max_new_tokens = 1 + rng() % 12;
    r.keep_logits = true;
    r.ignore_eos = rng() % 2 == 0;
    if (rng() % 3 > 0) {
      r.sampling.temperature = 0.5f + static_cast<float>(rng() % 100) / 100.0f;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = rng();
      r.sampling.presence_penalty = 0.3f;
    } else {
      r.sampling.temperature = 0;
    }
    if (rng() % 4 == 0) r.logit_bias.push_back({static_cast<int32_t>(rng() % vocab), 5.0f});
    if (rng() % 4 == 0) r.stop_tokens.push_back(static_cast<int32_t>(rng() % vocab));
    reqs.push_back(std::move(r));
  }
  return reqs;
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& what) {
  ASSERT_TRUE(a.finished && b.finished) << what;
  EXPECT_EQ(a.result.tokens, b.result.tokens) << what;
  EXPECT_EQ(a.result.reason, b.result.reason) << what;
  ASSERT_EQ(a.result.token_logits.size(), b.result.token_logits.size()) << what;
  EXPECT_EQ(std::memcmp(a.result.token_logits.data(), b.result.token_logits.data(),
                        a.result.token_logits.size() * sizeof(float)),
            0)
      << what << ": logits differ";
  ASSERT_EQ(a.result.prompt_logits.size(), b.result.prompt_logits.size()) << what;
  EXPECT_EQ(std::memcmp(a.result.prompt_logits.data(), b.result.prompt_logits.data(),
                        a.result.prompt_logits.size() * sizeof(float)),
            0)
      << what << ": prompt logits differ";
}

// A request's tokens and logits do not depend on what else the engine runs, nor on the thread
// count: each alone in an engine vs all sharing one (staggered), at 1 and 2 threads.
TEST(Engine, RequestsAreBitwiseTheSameAloneAndTogether) {
  uint32_t seed = 11;
  for (const char* set : {"tiny-a", "tiny-b"}) {
    for (ActivationType act : {ActivationType::kF32, ActivationType::kBF16}) {
      std::mt19937 rng(seed++);
      EngineOptions o = f32_engine(16, 6);  // more requests than sequences: some wait
      o.activation = act;
      const auto reqs = random_requests(rng, 12, golden(set).weights.config.vocab_size);
      const int saved = parallel_threads();
      set_parallel_threads(1);
      std::vector<Outcome> alone;
      for (const auto& r : reqs) alone.push_back(run_requests(golden_model(set), o, {r})[0]);
      for (int threads : {1, 2}) {
        set_parallel_threads(threads);
        const auto together = run_requests(golden_model(set), o, reqs, true, seed);
        for (size_t i = 0; i < reqs.size(); ++i)
          expect_same(alone[i], together[i],
                      std::string(set) + (act == ActivationType::kF32 ? " f32" : " bf16") +
                          " threads " + std::to_string(threads) + " request " + std::to_string(i));
      }
      set_parallel_threads(saved);
    }
  }
}

TEST(Engine, SubmitRefusesBadRequestsNamingTheField) {
  auto model = golden_model("tiny-b");
  EngineOptions o = f32_engine(16, 2);
  o.context_length = 64;
  o.max_queue = 2;
  auto e = Engine::create(model, o);
  ASSERT_TRUE(e.is_ok()) << e.status().to_string();
  const int64_t V = model->info().vocab_size;
  struct Case {
    const char* what;
    GenerationRequest r;
    ErrorCode code;
    const char* needle;
  };
  std::vector<Case> cases;
  auto add = [&](const char* what, auto mutate, ErrorCode code, const char* needle) {
    GenerationRequest r = greedy({1, 2, 3}, 4);
    mutate(r);
    cases.push_back({what, r, code, needle});
  };
  add(
      "empty", [](GenerationRequest& r) { r.prompt.clear(); }, ErrorCode::kInvalidArgument,
      "prompt");
  add(
      "bad id", [&](GenerationRequest& r) { r.prompt[1] = static_cast<int32_t>(V); },
      ErrorCode::kInvalidArgument, "position 1");
  add(
      "long prompt", [](GenerationRequest& r) { r.prompt.assign(64, 1); },
      ErrorCode::kContextLengthExceeded, "64 tokens");
  add(
      "strict",
      [](GenerationRequest& r) {
        r.strict_context = true;
        r.max_new_tokens = 62;
      },
      ErrorCode::kContextLengthExceeded, "max_new_tokens 62");
  add(
      "zero",
      [](GenerationRequest& r) {
        r.max_new_tokens = 0;
        r.keep_logits = false;
      },
      ErrorCode::kInvalidArgument, "max_new_tokens");
  add(
      "temperature", [](GenerationRequest& r) { r.sampling.temperature = -1; },
      ErrorCode::kInvalidArgument, "temperature");
  add(
      "bias",
      [&](GenerationRequest& r) {
        r.logit_bias.push_back({static_cast<int32_t>(V), 1});
      },
      ErrorCode::kInvalidArgument, "logit_bias");
  add(
      "logprobs", [](GenerationRequest& r) { r.top_logprobs = 21; }, ErrorCode::kInvalidArgument,
      "top_logprobs");
  add(
      "forced", [](GenerationRequest& r) { r.forced_tokens = {1}; }, ErrorCode::kInvalidArgument,
      "forced");
  add(
      "stop strings without tokenizer", [](GenerationRequest& r) { r.stop_strings = {"x"}; },
      ErrorCode::kInvalidArgument, "tokenizer");
  for (const Case& c : cases) {
    auto id = (*e)->submit(c.r, {});
    ASSERT_FALSE(id.is_ok()) << c.what;
    EXPECT_EQ(id.status().code(), c.code) << c.what << ": " << id.status().to_string();
    EXPECT_NE(id.status().message().find(c.needle), std::string::npos)
        << c.what << ": " << id.status().to_string();
  }
  // The queue holds two; the third waits for nothing and is refused as unavailable.
  ASSERT_TRUE((*e)->submit(greedy({1}, 2), {}).is_ok());
  ASSERT_TRUE((*e)->submit(greedy({2}, 2), {}).is_ok());
  auto third = (*e)->submit(greedy({3}, 2), {});
  ASSERT_FALSE(third.is_ok());
  EXPECT_EQ(third.status().code(), ErrorCode::kUnavailable);
  EXPECT_EQ((*e)->stats().rejected, static_cast<int64_t>(cases.size()) + 1);
  ASSERT_TRUE((*e)->run().is_ok());

  // A budget smaller than one request's worst case refuses it at submit.
  o.kv_budget = 1000;
  auto small = Engine::create(model, o);
  ASSERT_TRUE(small.is_ok());
  auto big = (*small)->submit(greedy({1, 2}, 40), {});
  ASSERT_FALSE(big.is_ok());
  EXPECT_EQ(big.status().code(), ErrorCode::kResourceExhausted) << big.status().to_string();
}

// A budget for two sequences at a time: five requests all complete, never more than two run,
// and every reserved byte comes back. Each equals its run alone.
TEST(Engine, KvBudgetBoundsTheRunningSetAndEveryRequestCompletes) {
  auto model = golden_model("tiny-a");
  EngineOptions o = f32_engine(8, 16);
  o.context_length = 100;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 5; ++i) reqs.push_back(greedy({1, 2, 3, static_cast<int32_t>(i)}, 20));
  auto probe = Engine::create(model, o);
  ASSERT_TRUE(probe.is_ok());
  // One request's reservation: KDA states + pages for its 25 positions (prompt + 20 + 1).
  const int64_t pages = (25 + o.page_tokens - 1) / o.page_tokens;
  const int64_t one =
      kda_state_bytes(model->weights().config) + pages * (*probe)->stats().kv_page_bytes;
  o.kv_budget = 2 * one;
  auto e = Engine::create(model, o);
  ASSERT_TRUE(e.is_ok());
  std::vector<Outcome> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    ASSERT_TRUE((*e)->submit(reqs[i], testing::record_into(out[i])).is_ok());
  int64_t most = 0;
  while ((*e)->has_work()) {
    ASSERT_TRUE((*e)->step().is_ok());
    most = std::max(most, (*e)->stats().running);
    EXPECT_LE((*e)->stats().kv_reserved_bytes, o.kv_budget);
  }
  EXPECT_EQ(most, 2);
  EXPECT_EQ((*e)->stats().kv_reserved_bytes, 0);
  EXPECT_EQ((*e)->stats().kv_pages_in_use, 0);
  o.kv_budget = -1;
  for (size_t i = 0; i < reqs.size(); ++i)
    expect_same(run_requests(model, o, {reqs[i]})[0], out[i], "request " + std::to_string(i));
}

// Cancelling a queued request finishes it at once; cancelling a running one stops it at the
// next step; the others are untouched (bitwise their runs alone).
TEST(Engine, CancelStopsOnlyThatRequest) {
  auto model = golden_model("tiny-b");
  const EngineOptions o = f32_engine(8, 2);
  std::vector<GenerationRequest> reqs = {greedy({5, 6, 7}, 30), greedy({8, 9}, 30),
                                         greedy({10, 11, 12, 13}, 6)};
  auto e = Engine::create(model, o);
  ASSERT_TRUE(e.is_ok());
  std::vector<Outcome> out(3);
  std::vector<RequestId> ids;
  for (size_t i = 0; i < 3; ++i)
    ids.push_back(*(*e)->submit(reqs[i], testing::record_into(out[i])));
  ASSERT_TRUE((*e)->step().is_ok());  // 0 and 1 run; 2 waits
  (*e)->cancel(ids[1]);
  ASSERT_TRUE((*e)->step().is_ok());
  EXPECT_TRUE(out[1].finished);
  EXPECT_EQ(out[1].result.reason, FinishReason::kCancelled);
  EXPECT_LE(out[1].result.tokens.size(), 2u);
  ASSERT_TRUE((*e)->run().is_ok());
  expect_same(run_requests(model, o, {reqs[0]})[0], out[0], "request 0");
  expect_same(run_requests(model, o, {reqs[2]})[0], out[2], "request 2");

  // A queued request is cancelled without running.
  Outcome q;
  auto first = (*e)->submit(reqs[0], {});
  auto second = (*e)->submit(reqs[1], {});
  auto queued = (*e)->submit(reqs[2], testing::record_into(q));
  ASSERT_TRUE(first.is_ok() && second.is_ok() && queued.is_ok());
  ASSERT_TRUE((*e)->step().is_ok());
  (*e)->cancel(*queued);
  EXPECT_TRUE(q.finished);
  EXPECT_EQ(q.result.reason, FinishReason::kCancelled);
  EXPECT_TRUE(q.result.tokens.empty());
  ASSERT_TRUE((*e)->run().is_ok());
}

// A model whose final norm weight is NaN: generation ends with an error that names the step and
// the token, not a stream of token 0 (argmax over NaN), and other requests are not affected.
TEST(Engine, NonFiniteLogitsAreAnErrorNamingTheStep) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("attnres_nan_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(fs::path(testing::golden_dir("tiny-a")) / f, dir / f);
  {
    std::fstream st(dir / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    uint64_t n = 0;
    st.read(reinterpret_cast<char*>(&n), 8);
    std::string header(n, '\0');
    st.read(header.data(), static_cast<std::streamsize>(n));
    const auto t = nlohmann::json::parse(header)["language_model.model.norm.weight"];
    ASSERT_EQ(t["dtype"], "BF16");
    const int64_t begin = t["data_offsets"][0], end = t["data_offsets"][1];
    st.seekp(static_cast<std::streamoff>(8 + n + static_cast<uint64_t>(begin)));
    for (int64_t i = begin; i < end; i += 2) st.write("\xc0\x7f", 2);  // bf16 quiet NaN
  }
  ModelLoadOptions lo;
  lo.dir = dir.string();
  lo.require_tokenizer = false;
  auto model = Model::load(lo);
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  for (ActivationType act : {ActivationType::kF32, ActivationType::kBF16}) {
    EngineOptions o = f32_engine(8, 2);
    o.activation = act;
    const std::vector<Outcome> out = run_requests(*model, o, {greedy({5, 6, 7}, 4)});
    ASSERT_TRUE(out[0].finished);
    EXPECT_EQ(out[0].result.reason, FinishReason::kError);
    EXPECT_TRUE(out[0].result.tokens.empty());
    const std::string m = out[0].result.error.message();
    EXPECT_NE(m.find("non-finite logit"), std::string::npos) << m;
    EXPECT_NE(m.find("at position 3 of request"), std::string::npos) << "names the step: " << m;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace attnres
