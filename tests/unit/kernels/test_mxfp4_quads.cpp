// MXFP4 codes in row quads (util/mxfp4_quads.h): the packed form holds the same values, and a job
// over it (WeightKind::kMxfp4Quads) gives exactly the bits of the job over the row-major codes, on
// every Highway target this CPU supports, for 1, 2 and 3 threads, with bf16 and with f32 tokens,
// at token counts that take every path of the MXFP4 kernels (the 4-row register tiles, the 3-row
// tiles of 6-7 tokens, the decoded-rows path from 11 tokens).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/hwy_targets.h"
#include "kernels/matmul.h"
#include "util/mxfp4_quads.h"
#include "util/numeric.h"
#include "util/parallel.h"

namespace attnres {
namespace {

struct Matrix4 {
  int64_t N, K;
  std::vector<uint8_t> packed, quads, scale;
  Matrix4(int64_t n, int64_t k, uint32_t seed) : N(n), K(k) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255), sc(118, 130);
    packed.resize(N * K / 2);
    scale.resize(N * K / kMxfp4BlockSize);
    for (uint8_t& b : packed) b = static_cast<uint8_t>(byte(rng));
    for (uint8_t& b : scale) b = static_cast<uint8_t>(sc(rng));
    scale[1 * (K / 32) + 1] = 255;  // row 1: a NaN block
    scale[2 * (K / 32)] = 254;      // row 2: 2^127 times codes up to 6 -> inf
    quads.resize(packed.size());
    pack_mxfp4_quads(packed.data(), N, K, quads.data());
  }
};

TEST(Mxfp4Quads, FitNeedsWholeQuadsAndPairsOfBlocks) {
  EXPECT_TRUE(mxfp4_quads_fit(4, 64));
  EXPECT_TRUE(mxfp4_quads_fit(512, 7168));
  EXPECT_FALSE(mxfp4_quads_fit(6, 64));  // a partial quad
  EXPECT_FALSE(mxfp4_quads_fit(8, 96));  // an odd number of blocks
  EXPECT_TRUE(mxfp4_quads_fit(0, 64));
}

TEST(Mxfp4Quads, PackedFormHoldsEveryElementOnce) {
  const Matrix4 m(12, 192, 1);
  std::vector<int> seen(m.packed.size(), 0);
  for (int64_t n = 0; n < m.N; ++n)
    for (int64_t k = 0; k < m.K; ++k) {
      const float a = mxfp4_quads_get(m.quads.data(), m.scale.data(), n, k, m.K);
      const float b =
          mxfp4_get(m.packed.data() + n * (m.K / 2), m.scale.data() + n * (m.K / 32), k);
      ASSERT_EQ(std::isnan(a), std::isnan(b)) << n << "," << k;
      if (!std::isnan(b)) {
        ASSERT_EQ(a, b) << n << "," << k;
      }
      if (k % 2 == 0) ++seen[static_cast<size_t>(mxfp4_quads_byte(n, k, m.K))];
    }
  for (int s : seen) ASSERT_EQ(s, 1);
  // Quad by quad, as the loader packs it.
  std::vector<uint8_t> by_quad(m.packed.size());
  for (int64_t g = 0; g < m.N / kMxfp4QuadRows; ++g)
    pack_mxfp4_quad(m.packed.data() + g * kMxfp4QuadRows * (m.K / 2), g, m.K, by_quad.data());
  EXPECT_EQ(by_quad, m.quads);
  // In place, as the loader packs what it read.
  std::vector<uint8_t> in_place = m.packed;
  pack_mxfp4_quads_in_place(in_place.data(), m.N, m.K);
  EXPECT_EQ(in_place, m.quads);
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b,
                      const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what;
}

TEST(Mxfp4Quads, JobsGiveTheRowMajorBits) {
  const int saved = parallel_threads();
  // [512, 1024] is large enough to be split over the threads; N = 36 leaves a last row group
  // off the 4 x 4 and 7 x 3 tiles.
  for (const auto& [N, K] : {std::pair<int64_t, int64_t>{36, 320}, {512, 1024}}) {
    SCOPED_TRACE("N " + std::to_string(N) + " K " + std::to_string(K));
    const Matrix4 m(N, K, 2);
    constexpr int64_t Tmax = 24;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(Tmax * K);
    std::vector<bf16> xh(Tmax * K);
    for (float& v : x) v = round_bf16(nd(rng));
    ASSERT_TRUE(bf16_exact_copy(x.data(), Tmax * K, xh.data()));
    for_each_target([&] {
      for (const int64_t T : {1, 2, 4, 5, 6, 7, 8, 11, 13, 24}) {
        if (N > 64 && T > 8) continue;  // the decoded-rows path at N = 36; keeps SCALAR quick
        for (const bool bf16_tokens : {true, false}) {
          SCOPED_TRACE("T " + std::to_string(T) + (bf16_tokens ? " bf16" : " f32") + " tokens");
          for (int threads : {1, 2, 3}) {
            set_parallel_threads(threads);
            std::vector<float> rows(T * N, -1.0f), quads(T * N, -2.0f);
            MatmulJob jobs[2] = {
                mxfp4_job(x.data(), T, m.packed.data(), m.scale.data(), N, K, rows.data()),
                mxfp4_job(x.data(), T, m.quads.data(), m.scale.data(), N, K, quads.data(),
                          Layout::kMxfp4Quads)};
            if (bf16_tokens) jobs[0].xh = jobs[1].xh = xh.data();
            matmul_batch(jobs, 2);
            expect_same_bits(quads, rows, std::to_string(threads) + " threads");
          }
        }
      }
    });
  }
  set_parallel_threads(saved);
}

TEST(Mxfp4Quads, TwinGivesTheRowMajorTwinsBits) {
  const Matrix4 m(8, 128, 4);
  constexpr int64_t T = 3;
  std::vector<float> x(T * m.K);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& v : x) v = nd(rng);
  std::vector<float> rows(T * m.N), quads(T * m.N), single(T * m.N);
  MatmulJob jobs[2] = {
      mxfp4_job(x.data(), T, m.packed.data(), m.scale.data(), m.N, m.K, rows.data()),
      mxfp4_job(x.data(), T, m.quads.data(), m.scale.data(), m.N, m.K, quads.data(),
                Layout::kMxfp4Quads)};
  matmul_batch_ref(jobs, 2);
  mxfp4_matmul_ref(x.data(), T, m.packed.data(), m.scale.data(), m.N, m.K, single.data());
  expect_same_bits(quads, rows, "twin");
  expect_same_bits(rows, single, "single reference");
}

}  // namespace
}  // namespace attnres
