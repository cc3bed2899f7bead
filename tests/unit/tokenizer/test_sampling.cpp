// Sampling kernel (src/kernels/sampling): the fast path equals its scalar twin exactly, each
// filter does what it says on hand-made logits, and a seed reproduces a run.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <random>

#include "kernels/sampling.h"

namespace attnres {
namespace {

TEST(Sampling, GreedyTakesLargestLowestIdOnTies) {
  SamplingScratch s;
  SamplingParams p;
  p.temperature = 0.0f;
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(sample_token(p, logits, {}, 0.99, s), 1);
  EXPECT_EQ(sample_token_ref(p, logits, {}, 0.99), 1);
  p.temperature = 1.0f;
  p.top_k = 1;  // top-1 is greedy too
  EXPECT_EQ(sample_token(p, logits, {}, 0.99, s), 1);
}

TEST(Sampling, PenaltiesFollowTheirRules) {
  SamplingScratch s;
  SamplingParams p;
  p.temperature = 0.0f;
  // Token 0 is best but repeated: repetition penalty 2 halves a positive logit (3 -> 1.5 < 2).
  p.repetition_penalty = 2.0f;
  EXPECT_EQ(sample_token(p, std::vector<float>{3.0f, 2.0f}, std::vector<int32_t>{0}, 0.5, s), 1);
  // Negative logits are multiplied: -1 -> -2 falls below -1.5.
  EXPECT_EQ(sample_token(p, std::vector<float>{-1.0f, -1.5f}, std::vector<int32_t>{0}, 0.5, s), 1);
  p.repetition_penalty = 1.0f;
  p.presence_penalty = 0.6f;  // once per distinct token: 2.5 - 0.6 = 1.9 < 2
  EXPECT_EQ(sample_token(p, std::vector<float>{2.5f, 2.0f}, std::vector<int32_t>{0, 0, 0}, 0.5, s),
            1);
  p.presence_penalty = 0.0f;
  p.frequency_penalty = 0.2f;  // per occurrence: 2.5 - 0.2*2 = 2.1 > 2, but 3 times -> 1.9 < 2
  EXPECT_EQ(sample_token(p, std::vector<float>{2.5f, 2.0f}, std::vector<int32_t>{0, 0}, 0.5, s), 0);
  EXPECT_EQ(sample_token(p, std::vector<float>{2.5f, 2.0f}, std::vector<int32_t>{0, 0, 0}, 0.5, s),
            1);
}

TEST(Sampling, FiltersRestrictTheCandidates) {
  SamplingScratch s;
  // probabilities ~ [0.643, 0.237, 0.087, 0.032] for logits [3, 2, 1, 0]
  const std::vector<float> logits = {3.0f, 2.0f, 1.0f, 0.0f};
  SamplingParams p;
  // u close to 1 picks the last kept token in id order.
  EXPECT_EQ(sample_token(p, logits, {}, 0.999999, s), 3);
  p.top_k = 2;
  EXPECT_EQ(sample_token(p, logits, {}, 0.999999, s), 1);
  p.top_k = 0;
  p.top_p = 0.85f;  // 0.643 + 0.237 = 0.88 >= 0.85: two tokens
  EXPECT_EQ(sample_token(p, logits, {}, 0.999999, s), 1);
  p.top_p = 1.0f;
  p.min_p = 0.1f;  // keeps p >= 0.0643: tokens 0, 1, 2
  EXPECT_EQ(sample_token(p, logits, {}, 0.999999, s), 2);
  // u = 0 always picks the first kept token in id order.
  EXPECT_EQ(sample_token(p, logits, {}, 0.0, s), 0);
  // Low temperature sharpens: at T=0.05 token 0 has essentially all the mass.
  p = SamplingParams{};
  p.temperature = 0.05f;
  EXPECT_EQ(sample_token(p, logits, {}, 0.999, s), 0);
}

TEST(Sampling, NonFiniteLogits) {
  SamplingScratch s;
  SamplingParams p;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> masked = {-inf, NAN, 1.0f, -inf};
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(sample_token(p, masked, {}, u, s), 2);
  const std::vector<float> all_masked = {-inf, -inf, NAN};
  EXPECT_EQ(sample_token(p, all_masked, {}, 0.5, s), 0);
  EXPECT_EQ(sample_token_ref(p, all_masked, {}, 0.5), 0);
}

// The fast path against the twin on random logits, histories and settings, with a large
// vocabulary so that the partial sorts and the growing top-p prefix are exercised.
TEST(Sampling, FastEqualsReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int V = 5000;
  SamplingScratch s;
  std::vector<float> logits(V);
  for (int iter = 0; iter < 120; ++iter) {
    for (float& x : logits) x = normal(rng);
    if (iter % 7 == 0) logits[rng() % V] = logits[rng() % V];  // ties
    std::vector<int32_t> history(rng() % 50);
    for (int32_t& h : history) h = static_cast<int32_t>(rng() % (V + 10)) - 5;  // some invalid
    SamplingParams p;
    p.temperature = std::array{0.0f, 0.3f, 0.7f, 1.0f, 1.5f}[rng() % 5];
    p.top_k = std::array{0, 0, 1, 5, 40, 4999, 6000}[rng() % 7];
    p.top_p = std::array{1.0f, 0.9f, 0.5f, 0.999f, 0.01f}[rng() % 5];
    p.min_p = std::array{0.0f, 0.0f, 0.05f, 0.3f}[rng() % 4];
    p.repetition_penalty = std::array{1.0f, 1.1f, 0.9f}[rng() % 3];
    p.presence_penalty = std::array{0.0f, 0.5f}[rng() % 2];
    p.frequency_penalty = std::array{0.0f, 0.25f}[rng() % 2];
    ASSERT_TRUE(validate_sampling_params(p).is_ok());
    const double u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
    ASSERT_EQ(sample_token(p, logits, history, u, s), sample_token_ref(p, logits, history, u))
        << "iter " << iter;
  }
}

TEST(Sampling, SeedReproducesRun) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> steps(30, std::vector<float>(1000));
  for (auto& l : steps)
    for (float& x : l) x = normal(rng);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.95f;
  auto run = [&](uint64_t seed) {
    p.seed = seed;
    Sampler sampler(p, 1000);
    std::vector<int32_t> out;
    for (const auto& l : steps) out.push_back(sampler.sample(l, out));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  SamplingRng a(7), b(7);
  for (int i = 0; i < 10; ++i) {
    const double u = a.next_uniform();
    EXPECT_EQ(u, b.next_uniform());
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

TEST(Sampling, ValidationNamesTheField) {
  SamplingParams p;
  p.top_p = 0.0f;
  Status st = validate_sampling_params(p);
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("top_p must be in (0, 1]"), std::string::npos) << st.message();
  p = SamplingParams{};
  p.temperature = -1.0f;
  EXPECT_NE(validate_sampling_params(p).message().find("temperature"), std::string::npos);
  p = SamplingParams{};
  p.repetition_penalty = 0.0f;
  EXPECT_NE(validate_sampling_params(p).message().find("repetition_penalty"), std::string::npos);
}

}  // namespace
}  // namespace attnres
