// Accuracy of chunked prefill on a deep model (issue 17, item 3): the `deep` preset (the
// published 93 layers and block size 12 at hidden 64) in f32 activations with an f32 latent
// cache, prefilled in segments of 1, 7, 64 and 4096 tokens (1 runs KDA's recurrent form and
// MLA's absorbed form per token; longer segments the chunked WY / UT form in WY chunks of 64 and
// expanded MLA), every logit row against a float64 evaluation of the same forward
// (f64_forward.h). The chunked form's error may be at most 1.5x the recurrent form's.
//
// The bound is on the root-mean-square error over every logit, on the target the engine
// dispatches to; the largest error is printed too. On a 93-layer random model every rounding is
// amplified chaotically, so which single logit is worst, and by how much, moves with any change
// of rounding order: two equally accurate forms (the recurrent KDA form with expanded vs
// absorbed MLA, or the same forward on another SIMD target) differ by up to 2-3x in the largest
// error, while the mean square averages 131k logits. Before the cumulative gates were summed in
// double (kda.h), the chunked form was 4.7x the recurrent form's largest error here.
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

#include <hwy/targets.h>
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

// Error of the f32 logits of a prefill in segments of `segment` tokens against the f64 ones.
struct LogitError {
  double max = 0.0;  // largest |logit - f64 logit|
  double rms = 0.0;  // root mean square over every logit of every row
};

LogitError logit_error(const DeepCase& c, int64_t segment) {
  SessionOptions o;
  o.forward.act = ActDType::kF32;
  o.forward.kv = KvCacheDtype::kF32;
  o.chunk_size = segment;
  auto s = Session::create(c.weights, o);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  std::vector<float> logits;
  const Status st = (*s)->prefill(c.prompt, /*all_logits=*/true, logits);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  EXPECT_EQ(logits.size(), c.want.size());
  LogitError e;
  const size_t n = std::min(logits.size(), c.want.size());
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(logits[i] - c.want[i]);
    e.max = std::max(e.max, d);
    e.rms += d * d;
  }
  e.rms = std::sqrt(e.rms / static_cast<double>(std::max<size_t>(n, 1)));
  return e;
}

// Segments of 1 token run the recurrent form (and absorbed MLA); 7 one short WY chunk per
// segment; 64 one full chunk; 4096 the whole prompt in WY chunks of 64 carrying the state.
void check_chunked_against_recurrent(const DeepCase& c, const char* label) {
  double scale = 0.0;
  for (double x : c.want) scale = std::max(scale, std::fabs(x));
  const LogitError recurrent = logit_error(c, 1);
  std::printf(
      "%s: deep model, %zu tokens, max |logit| %.3f; |logit - f64| max / rms: "
      "segment 1 %.3g / %.3g",
      label, c.prompt.size(), scale, recurrent.max, recurrent.rms);
  ASSERT_GT(recurrent.rms, 0.0) << "f32 and f64 cannot agree exactly";
  for (int64_t segment : {7, 64, 4096}) {
    const LogitError e = logit_error(c, segment);
    std::printf(", segment %lld %.3g (%.2fx) / %.3g (%.2fx)", static_cast<long long>(segment),
                e.max, e.max / recurrent.max, e.rms, e.rms / recurrent.rms);
    EXPECT_LE(e.rms, kMaxRatio * recurrent.rms) << label << ", segment " << segment;
  }
  std::printf("\n");
}

TEST(KdaAccuracy, ChunkedPrefillIsAsAccurateAsRecurrentOnDeepModel) {
  const DeepCase& c = deep_case();
  ASSERT_GE(c.weights.config.schedule.num_layers(), 90);
  ASSERT_EQ(c.weights.config.schedule.block_size, 12);
  // The target the engine dispatches to (the best this CPU supports, listed first).
  check_chunked_against_recurrent(c, hwy::TargetName(hwy::SupportedAndGeneratedTargets()[0]));
}

}  // namespace
}  // namespace attnres
