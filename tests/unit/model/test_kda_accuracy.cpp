// Accuracy of chunked prefill on a deep model (issue 17, item 3): the `deep` preset (the
// published 93 layers and block size 12 at hidden 64) in f32 activations with an f32 latent
// cache, prefilled in segments of 1, 7, 64 and 4096 tokens (1 runs KDA's recurrent form and
// MLA's absorbed form per token; longer segments the chunked WY / UT form in WY chunks of 64 and
// expanded MLA), every logit row against a float64 evaluation of the same forward
// (f64_forward.h). The chunked form's error may be at most 1.5x the recurrent form's.
//
// The prompt is kTokens long (ATTNRES_ACCURACY_TOKENS overrides it for measurements; 4096 makes
// the 4096 segment one chunk): long enough for several WY chunks of 64 and for the KDA states
// to carry information across them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "f64_forward.h"
#include "runtime/session.h"
#include "synth/synth.h"

namespace attnres {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kTokens = 256;
constexpr double kMaxRatio = 1.5;

int64_t prompt_tokens() {
  const char* env = std::getenv("ATTNRES_ACCURACY_TOKENS");
  return env ? std::max<int64_t>(1, std::atoll(env)) : kTokens;
}

// The deep model, its prompt and the f64 logits, made once per process.
struct DeepCase {
  ModelWeights weights;
  std::vector<int32_t> prompt;
  std::vector<double> want;  // [T, V]
};

const DeepCase& deep_case() {
  static const DeepCase* c = [] {
    const fs::path dir = fs::temp_directory_path() / ("attnres_deep_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    auto preset = synth_preset("deep");
    EXPECT_TRUE(preset.is_ok());
    auto written = write_synthetic_model(*preset, dir.string(), /*seed=*/1);
    EXPECT_TRUE(written.is_ok()) << written.status().to_string();
    auto w = load_model(dir.string());
    EXPECT_TRUE(w.is_ok()) << w.status().to_string();
    auto* out = new DeepCase{std::move(w.value()), {}, {}};
    std::mt19937 rng(17);
    const int64_t T = prompt_tokens();
    for (int64_t t = 0; t < T; ++t)
      out->prompt.push_back(static_cast<int32_t>(rng() % (out->weights.config.vocab_size - 256)));
    out->want = testing::f64_forward(out->weights, out->prompt);
    fs::remove_all(dir);  // the weights stay mapped
    return out;
  }();
  return *c;
}

// Largest |logit - f64 logit| over every row of a prefill in segments of `chunk` tokens.
double max_error(const DeepCase& c, int64_t chunk, int64_t kda_chunk = 64) {
  SessionOptions o;
  o.forward.act = ActDType::kF32;
  o.forward.kv = KvCacheDtype::kF32;
  o.forward.kda_chunk = kda_chunk;
  o.chunk_size = chunk;
  auto s = Session::create(c.weights, o);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  std::vector<float> logits;
  const Status st = (*s)->prefill(c.prompt, /*all_logits=*/true, logits);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(logits.size(), c.want.size());
  double err = 0.0;
  for (size_t i = 0; i < logits.size() && i < c.want.size(); ++i)
    err = std::max(err, std::fabs(logits[i] - c.want[i]));
  return err;
}

TEST(KdaAccuracy, ChunkedPrefillIsAsAccurateAsRecurrentOnDeepModel) {
  const DeepCase& c = deep_case();
  ASSERT_GE(c.weights.config.schedule.num_layers(), 90);
  ASSERT_EQ(c.weights.config.schedule.block_size, 12);
  double scale = 0.0;
  for (double x : c.want) scale = std::max(scale, std::fabs(x));
  const double recurrent = max_error(c, 1);
  std::printf("deep model, %zu tokens, max |logit| %.3f; max |logit - f64|: chunk 1 %.3g",
              c.prompt.size(), scale, recurrent);
  ASSERT_GT(recurrent, 0.0) << "f32 and f64 cannot agree exactly";
  for (int64_t chunk : {7, 64, 4096}) {
    const double err = max_error(c, chunk);
    std::printf(", chunk %lld %.3g (%.2fx)", static_cast<long long>(chunk), err, err / recurrent);
    EXPECT_LE(err, kMaxRatio * recurrent) << "chunk " << chunk;
  }
  std::printf("\n");
}

}  // namespace
}  // namespace attnres
