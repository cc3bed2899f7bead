// End-to-end golden tests (f32 activations): every case of tiny-a and tiny-b, prefill logits,
// teacher-forced decode logits and greedy ids against the official reference code, plus
// tiny-a's per-layer intermediates so a failure names the layer and sublayer.
#include <gtest/gtest.h>

#include "golden_util.h"

namespace attnres {
namespace {

using testing::golden;

constexpr float kLogitTol = 2e-3f;  // golden README: f32 noise <= 3.8e-4, mistakes >= 1

class GoldenCases : public ::testing::TestWithParam<const char*> {};

TEST_P(GoldenCases, PrefillLogitsMatch) {
  const testing::GoldenSet& g = golden(GetParam());
  ASSERT_GT(g.num_cases, 0);
  for (int c = 0; c < g.num_cases; ++c) {
    const std::string p = "case" + std::to_string(c) + ".";
    std::vector<float> got =
        testing::prefill(g.weights, g.ids(p + "prompt_ids"), testing::f32_options());
    const float diff = testing::max_abs_diff(got, g.floats(p + "prefill_logits"));
    EXPECT_LT(diff, kLogitTol) << GetParam() << " case " << c;
    std::printf("[ %s case %d ] prefill max|diff| %.3g\n", GetParam(), c, diff);
  }
}

TEST_P(GoldenCases, DecodeLogitsAndGreedyIdsMatch) {
  const testing::GoldenSet& g = golden(GetParam());
  const int64_t V = g.weights.config.vocab_size;
  for (int c = 0; c < g.num_cases; ++c) {
    const std::string p = "case" + std::to_string(c) + ".";
    const std::vector<int32_t> greedy = g.ids(p + "greedy_ids");
    std::vector<float> got =
        testing::decode_rows(g.weights, g.ids(p + "prompt_ids"), greedy, testing::f32_options());
    const float diff = testing::max_abs_diff(got, g.floats(p + "decode_logits"));
    EXPECT_LT(diff, kLogitTol) << GetParam() << " case " << c;
    EXPECT_EQ(testing::argmax_rows(got, V), greedy) << GetParam() << " case " << c;
    std::printf("[ %s case %d ] decode max|diff| %.3g\n", GetParam(), c, diff);
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenCases, ::testing::Values("tiny-a", "tiny-b"));

// tiny-a case 1, layer by layer: the first mismatching intermediate names layer and sublayer.
TEST(GoldenIntermediates, TinyAMatchesLayerByLayer) {
  const testing::GoldenSet& g = golden("tiny-a");
  ASSERT_TRUE(g.intermediates);
  std::vector<int32_t> prompt;
  {
    auto t = g.intermediates->tensor("prompt_ids");
    ASSERT_TRUE(t.is_ok());
    ASSERT_EQ(t->dtype, DType::kI32);
    for (int64_t i = 0; i < t->numel(); ++i) prompt.push_back(t->as<int32_t>()[i]);
  }
  int compared = 0;
  std::vector<std::string> mismatches;
  CaptureFn capture = [&](const std::string& name, const float* data, int64_t rows, int64_t cols) {
    std::string ref_name = name;
    int64_t slot = -1;
    if (auto pos = name.find(".bank."); pos != std::string::npos) {
      slot = std::stoll(name.substr(pos + 6));
      ref_name = name.substr(0, pos) + ".bank";
    }
    if (!g.intermediates->contains(ref_name)) return;
    TensorView ref = g.intermediates->tensor(ref_name).value();
    float diff = 0.0f, scale = 0.0f;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < cols; ++i) {
        const int64_t ri = slot < 0 ? r * cols + i : (r * ref.shape[1] + slot) * cols + i;
        const float want = ref.as<float>()[ri];
        diff = std::max(diff, std::fabs(data[r * cols + i] - want));
        scale = std::max(scale, std::fabs(want));
      }
    ++compared;
    if (diff > 1e-4f * std::max(1.0f, scale)) {
      mismatches.push_back(name + ": max|diff| " + std::to_string(diff) + " (max|ref| " +
                           std::to_string(scale) + ")");
    }
  };
  testing::TestSequence seq(g.weights.config, KvCacheDtype::kF32);
  SequenceState& state = seq.state;
  Arena arena;
  std::vector<float> logits(prompt.size() * static_cast<size_t>(g.weights.config.vocab_size));
  ASSERT_TRUE(reference_forward(g.weights, state, testing::f32_options(), arena, prompt.data(),
                                static_cast<int64_t>(prompt.size()), true, logits.data(), &capture)
                  .is_ok());
  EXPECT_GE(compared, 13 * 6 + 3);
  EXPECT_TRUE(mismatches.empty()) << "first mismatch: " << mismatches.front() << " (and "
                                  << mismatches.size() - 1 << " more)";
}

}  // namespace
}  // namespace attnres
