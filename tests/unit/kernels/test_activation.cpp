// Dispatched SiTU (activation_hwy.cpp) against its scalar twin situ_ref() (libm), on every
// Highway target this CPU supports: within a few ulp per factor over a wide range of inputs
// (including saturated tanh and sigmoid), lengths off the vector width, in place, bf16 output;
// and position/thread-count independence (an element's value depends only on its inputs).
#include <gtest/gtest.h>
#include "util/parallel.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/activation.h"
#include "kernels/hwy_targets.h"
#include "util/numeric.h"

namespace attnres {
namespace {

constexpr float kBeta = 4.0f, kLinearBeta = 25.0f;

void random_inputs(int64_t n, uint32_t seed, std::vector<float>& g, std::vector<float>& u) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::uniform_real_distribution<float> wide(-120.0f, 120.0f);
  g.resize(static_cast<size_t>(n));
  u.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    g[static_cast<size_t>(i)] = i % 5 == 0 ? wide(rng) : nd(rng);
    u[static_cast<size_t>(i)] = i % 7 == 0 ? wide(rng) : nd(rng) * 10.0f;
  }
}

// Each of the three factors is within a few ulp (tanh from Highway's Expm1 and a division
// shared by both tanh, the sigmoid as 1 / (1 + Exp)), so the product is within ~16 ulp relative
// (observed: 5.3 ulp at most over 4M random pairs); plus an absolute floor for results near
// zero, where the sigmoid is flushed.
void expect_close(const std::vector<float>& y, const std::vector<float>& ref) {
  for (size_t i = 0; i < y.size(); ++i) {
    const float tol = 16.0f * std::ldexp(1.0f, -23) * std::fabs(ref[i]) + 1e-30f;
    ASSERT_LE(std::fabs(y[i] - ref[i]), tol) << "i=" << i << " y=" << y[i] << " ref=" << ref[i];
  }
}

TEST(Situ, MatchesScalarTwinOnEveryTarget) {
  for_each_target([] {
    for (int64_t n : {1, 3, 8, 15, 16, 17, 33, 1000, 4097}) {
      std::vector<float> g, u;
      random_inputs(n, static_cast<uint32_t>(n), g, u);
      std::vector<float> y(g.size()), ref(g.size());
      situ(g.data(), u.data(), n, kBeta, kLinearBeta, false, y.data());
      situ_ref(g.data(), u.data(), n, kBeta, kLinearBeta, false, ref.data());
      expect_close(y, ref);
      // In place over the gate, and bf16 output: the same values, then rounded.
      std::vector<float> inplace = g, yb(g.size());
      situ(inplace.data(), u.data(), n, kBeta, kLinearBeta, false, inplace.data());
      EXPECT_EQ(0, std::memcmp(inplace.data(), y.data(), y.size() * sizeof(float)));
      situ(g.data(), u.data(), n, kBeta, kLinearBeta, true, yb.data());
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(yb[i]), std::bit_cast<uint32_t>(round_bf16(y[i]))) << i;
      // Stored as bf16: those values' bits, and the twin's likewise.
      std::vector<bf16> h(g.size()), refh(g.size());
      std::vector<float> refb(g.size());
      situ(g.data(), u.data(), n, kBeta, kLinearBeta, h.data());
      situ_ref(g.data(), u.data(), n, kBeta, kLinearBeta, refh.data());
      situ_ref(g.data(), u.data(), n, kBeta, kLinearBeta, true, refb.data());
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_EQ(h[i].bits, f32_to_bf16(yb[i]).bits) << i;
        ASSERT_EQ(refh[i].bits, f32_to_bf16(refb[i]).bits) << i;
      }
    }
  });
}

TEST(Situ, SaturatedAndSpecialInputs) {
  const std::vector<float> g = {0.0f, -0.0f, 200.0f, -200.0f, 1e-30f, 90.0f, -90.0f, 3.0f};
  const std::vector<float> u = {5.0f, 5.0f, 1e4f, -1e4f, 1.0f, -0.5f, 2.0f, 0.0f};
  const int64_t n = static_cast<int64_t>(g.size());
  for_each_target([&] {
    std::vector<float> y(g.size()), ref(g.size());
    situ(g.data(), u.data(), n, kBeta, kLinearBeta, false, y.data());
    situ_ref(g.data(), u.data(), n, kBeta, kLinearBeta, false, ref.data());
    for (float v : y) EXPECT_TRUE(std::isfinite(v));
    expect_close(y, ref);
    EXPECT_EQ(y[0], 0.0f);
    EXPECT_EQ(y[7], 0.0f);
  });
}

// Infinite inputs saturate as in situf(); a NaN gate or up gives a NaN (the kernel's clamps
// would otherwise turn it into a finite value).
TEST(Situ, InfiniteAndNanInputs) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> g = {inf, -inf, 2.0f, -inf, nan, 1.0f, nan};
  const std::vector<float> u = {1.0f, 3.0f, inf, -inf, 1.0f, nan, nan};
  const int64_t n = static_cast<int64_t>(g.size());
  for_each_target([&] {
    std::vector<float> y(g.size()), ref(g.size());
    situ(g.data(), u.data(), n, kBeta, kLinearBeta, false, y.data());
    situ_ref(g.data(), u.data(), n, kBeta, kLinearBeta, false, ref.data());
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_NEAR(y[i], ref[i], 16.0f * std::ldexp(1.0f, -23) * std::fabs(ref[i])) << "i=" << i;
    for (int64_t i = 4; i < n; ++i) {
      EXPECT_TRUE(std::isnan(ref[i])) << "i=" << i;
      EXPECT_TRUE(std::isnan(y[i])) << "i=" << i;
    }
    // bf16 output (in f32 and stored as bf16): the f32 results rounded, NaNs quieted as
    // round_bf16 does.
    std::vector<float> yb(g.size());
    situ(g.data(), u.data(), n, kBeta, kLinearBeta, true, yb.data());
    std::vector<bf16> h(g.size());
    situ(g.data(), u.data(), n, kBeta, kLinearBeta, h.data());
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(yb[i]), std::bit_cast<uint32_t>(round_bf16(y[i])))
          << "i=" << i;
      EXPECT_EQ(h[i].bits, f32_to_bf16(yb[i]).bits) << "i=" << i;
    }
  });
}

// An element's value depends only on its inputs: the same pairs at other offsets, inside
// longer arrays (other vector lanes, other blocks) and with 1, 2 or 3 threads give the same bits.
TEST(Situ, PositionAndThreadCountInvariant) {
  const int saved = parallel_threads();
  std::vector<float> g, u;
  random_inputs(70001, 9, g, u);  // above the parallel cutoff, not a multiple of any width
  std::vector<float> base(g.size());
  set_parallel_threads(1);
  situ(g.data(), u.data(), static_cast<int64_t>(g.size()), kBeta, kLinearBeta, false, base.data());
  for (int threads : {2, 3}) {
    set_parallel_threads(threads);
    std::vector<float> y(g.size());
    situ(g.data(), u.data(), static_cast<int64_t>(g.size()), kBeta, kLinearBeta, false, y.data());
    EXPECT_EQ(0, std::memcmp(y.data(), base.data(), y.size() * sizeof(float))) << threads;
  }
  set_parallel_threads(saved);
  for (int64_t off : {1, 5, 13}) {
    const int64_t n = 37;
    std::vector<float> y(static_cast<size_t>(n));
    situ(g.data() + off, u.data() + off, n, kBeta, kLinearBeta, false, y.data());
    EXPECT_EQ(0, std::memcmp(y.data(), base.data() + off, y.size() * sizeof(float))) << off;
  }
}

}  // namespace
}  // namespace attnres
