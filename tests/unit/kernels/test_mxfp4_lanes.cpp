// MXFP4 projections over the 16-row lane layout (mxfp4_lanes.h): the packed layout holds every
// element once; the dispatched kernel gives its scalar twin's bits on every Highway target this
// CPU supports, for every tile size and row range, with bf16 tokens (and with f32 tokens on
// targets with FMA), scale bytes 0, 1, 254 and 255 included (row ranges with and without them,
// and a range without them run both as the loader claims it, normal_scales, and without the
// claim); the claim holds unless a byte is 0 or 255; a token alone gives the bits it gets among
// others; and the result agrees with an f64 evaluation within the rounding bound.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/hwy_targets.h"
#include "kernels/matmul.h"
#include "kernels/mxfp4_lanes.h"
#include "util/mxfp4_lanes.h"
#include "util/numeric.h"
#include "util/parallel.h"

namespace attnres {
namespace {

struct LaneMatrix {
  int64_t N, K;
  std::vector<uint8_t> codes, scales;  // row-major
  std::vector<uint8_t> lane_codes, lane_scales;
  bool normal = false;  // no scale byte 0 or 255: the loader's normal_scales
  LaneMatrix(int64_t n, int64_t k, uint32_t seed, bool edge_scales) : N(n), K(k) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255), sc(118, 130);
    codes.resize(N * K / 2);
    scales.resize(N * K / kMxfp4BlockSize);
    for (uint8_t& b : codes) b = static_cast<uint8_t>(byte(rng));
    for (uint8_t& b : scales) b = static_cast<uint8_t>(sc(rng));
    if (edge_scales) {
      const int64_t blocks = K / kMxfp4BlockSize;
      scales[1 * blocks] = 0;                 // row 1: 2^-127
      scales[2 * blocks] = 1;                 // row 2: 2^-126
      scales[3 * blocks + blocks - 1] = 254;  // row 3: 2^127 (products may overflow)
      scales[4 * blocks] = 255;               // row 4: NaN
    }
    lane_codes.resize(codes.size());
    lane_scales.resize(scales.size());
    pack_mxfp4_lanes(codes.data(), scales.data(), N, K, lane_codes.data(), lane_scales.data());
    normal = mxfp4_scales_normal(lane_scales.data(), static_cast<int64_t>(lane_scales.size()));
  }
};

// Tokens as bf16 values (xh, and x: the same values in f32) and as f32 values with full
// mantissas (xf: products that round, so only a fused multiply-add gives the twin's bits).
struct TokenRows {
  std::vector<float> x, xf;
  std::vector<bf16> xh;
  TokenRows(int64_t T, int64_t K, uint32_t seed) : x(T * K), xf(T * K), xh(T * K) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < T * K; ++i) {
      xf[i] = nd(rng);
      xh[i] = f32_to_bf16(xf[i]);
      x[i] = bf16_to_f32(xh[i]);
    }
  }
};

// Equal bits, or both NaN (the payload of a NaN from a NaN scale is not specified).
void expect_same(const std::vector<float>& a, const std::vector<float>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    uint32_t ua, ub;
    std::memcpy(&ua, &a[i], 4);
    std::memcpy(&ub, &b[i], 4);
    ASSERT_EQ(ua, ub) << what << ": element " << i << " " << a[i] << " vs " << b[i];
  }
}

TEST(Mxfp4Lanes, FitNeedsWholeGroupsAndBlocks) {
  EXPECT_TRUE(mxfp4_lanes_fit(16, 32));
  EXPECT_TRUE(mxfp4_lanes_fit(2048, 7168));
  EXPECT_FALSE(mxfp4_lanes_fit(24, 64));  // a partial group
  EXPECT_FALSE(mxfp4_lanes_fit(16, 48));  // a partial block
}

TEST(Mxfp4Lanes, PackedFormHoldsEveryElementOnce) {
  const LaneMatrix m(48, 96, 1, true);
  std::vector<int> seen_codes(2 * m.codes.size(), 0), seen_scales(m.scales.size(), 0);
  for (int64_t n = 0; n < m.N; ++n)
    for (int64_t k = 0; k < m.K; ++k) {
      const float a = mxfp4_lanes_get(m.lane_codes.data(), m.lane_scales.data(), n, k, m.K);
      const float b =
          mxfp4_get(m.codes.data() + n * (m.K / 2), m.scales.data() + n * (m.K / 32), k);
      ASSERT_EQ(std::isnan(a), std::isnan(b)) << n << "," << k;
      if (!std::isnan(b)) {
        ASSERT_EQ(a, b) << n << "," << k;
      }
      ++seen_codes[static_cast<size_t>(mxfp4_lanes_nibble(n, k, m.K))];
      if (k % kMxfp4BlockSize == 0)
        ++seen_scales[static_cast<size_t>(mxfp4_lanes_scale(n, k / kMxfp4BlockSize, m.K))];
    }
  for (int s : seen_codes) ASSERT_EQ(s, 1);
  for (int s : seen_scales) ASSERT_EQ(s, 1);
}

TEST(Mxfp4Lanes, KernelGivesTheTwinsBits) {
  // K = 32 is one block, 96 three; N = 160 takes 8-group tiles and a ragged remainder of them.
  for (const auto& [N, K] : {std::pair<int64_t, int64_t>{16, 32}, {48, 96}, {160, 512}}) {
    SCOPED_TRACE("N " + std::to_string(N) + " K " + std::to_string(K));
    // Scale bytes 0 and 1 make subnormal scaled block sums, which targets without FMA round
    // twice (a product, then a sum): those targets run the matrix without them.
    const LaneMatrix edges(N, K, 2, true), plain(N, K, 2, false);
    constexpr int64_t Tmax = 17;
    const TokenRows x(Tmax, K, 3);
    for_each_target([&](int64_t target) {
      const bool fma = target < HWY_SSE4;  // AVX2 and the AVX-512 targets
      const LaneMatrix& m = fma ? edges : plain;
      for (int64_t T = 1; T <= Tmax; ++T) {
        for (const bool bf16_tokens : {true, false}) {
          // f32 tokens give the twin's bits where MulAdd is a fused multiply-add.
          if (!bf16_tokens && !fma) continue;
          SCOPED_TRACE("T " + std::to_string(T) + (bf16_tokens ? " bf16" : " f32") + " tokens");
          const bf16* xh = bf16_tokens ? x.xh.data() : nullptr;
          // Every row, then the rows from the second group on (a call's row range: with the
          // edge scales, the first range has bytes 0 and 255 and the second none).
          for (const int64_t row0 : {int64_t{0}, int64_t{16}}) {
            if (row0 >= N) continue;
            const int64_t rows = N - row0, ldy = N + 3, blocks = K / kMxfp4BlockSize;
            const bool normal =
                mxfp4_scales_normal(m.lane_scales.data() + row0 * blocks, rows * blocks);
            std::vector<float> want(T * ldy, -1.0f);
            mxfp4_lanes_ref(xh, x.xf.data(), T, m.lane_codes.data(), m.lane_scales.data(), N, K,
                            row0, rows, want.data(), ldy);
            std::vector<float> want_rounded(want);
            for (float& w : want_rounded) w = round_bf16(w);  // the gaps' -1 stay -1
            for (const bool claim : {false, true})
              for (const bool round : {false, true}) {
                if (claim && !normal) continue;
                std::vector<float> got(T * ldy, -1.0f);
                mxfp4_lanes_rows(xh, x.xf.data(), T, m.lane_codes.data(), m.lane_scales.data(), N,
                                 K, row0, rows, got.data(), ldy,
                                 {.normal_scales = claim, .round_bf16 = round});
                expect_same(got, round ? want_rounded : want,
                            "row0 " + std::to_string(row0) + (claim ? " normal_scales" : "") +
                                (round ? " round_bf16" : ""));
              }
          }
        }
      }
    });
  }
}

TEST(Mxfp4Lanes, ScalesAreNormalUnlessAByteIsZeroOr255) {
  // Every length up to a few vectors' worth, every position of the odd byte.
  for (int64_t n = 0; n <= 80; ++n) {
    std::vector<uint8_t> s(static_cast<size_t>(n), 127);
    EXPECT_TRUE(mxfp4_scales_normal(s.data(), n)) << n;
    for (int64_t i = 0; i < n; ++i) {
      for (const uint8_t b : {uint8_t{0}, uint8_t{255}}) {
        s[static_cast<size_t>(i)] = b;
        EXPECT_FALSE(mxfp4_scales_normal(s.data(), n)) << n << " " << i << " " << int{b};
      }
      for (const uint8_t b : {uint8_t{1}, uint8_t{254}}) {
        s[static_cast<size_t>(i)] = b;
        EXPECT_TRUE(mxfp4_scales_normal(s.data(), n)) << n << " " << i << " " << int{b};
      }
      s[static_cast<size_t>(i)] = 127;
    }
  }
}

TEST(Mxfp4Lanes, ATokenAloneGetsTheBitsItGetsAmongOthers) {
  const int64_t N = 64, K = 256, T = 13;
  const LaneMatrix m(N, K, 4, false);
  const TokenRows x(T, K, 5);
  std::vector<float> all(T * N);
  mxfp4_lanes_rows(x.xh.data(), nullptr, T, m.lane_codes.data(), m.lane_scales.data(), N, K, 0, N,
                   all.data(), N, {.normal_scales = m.normal});
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> one(N), among(all.begin() + t * N, all.begin() + (t + 1) * N);
    mxfp4_lanes_rows(x.xh.data() + t * K, nullptr, 1, m.lane_codes.data(), m.lane_scales.data(), N,
                     K, 0, N, one.data(), N, {.normal_scales = m.normal});
    expect_same(one, among, "token " + std::to_string(t));
  }
}

TEST(Mxfp4Lanes, RowMajorCodesGiveTheLanesBits) {
  // Row-major codes of any N: the outputs of each row are the twin's over the matrix padded to
  // whole groups (rows past N: zero codes), whatever row range a call covers. N = 300 holds two
  // 128-row chunks, two whole groups of a third and a ragged group of 12 rows; K = 1056 has 33
  // blocks (scales transposed 16 blocks at a time, then one alone); N = 48 and 40 at K = 256
  // and 512 are whole groups (and a ragged one) of longer rows.
  for (const auto& [N, K] : {std::pair<int64_t, int64_t>{5, 32},
                             {16, 64},
                             {300, 96},
                             {20, 1056},
                             {48, 256},
                             {40, 512}}) {
    SCOPED_TRACE("N " + std::to_string(N) + " K " + std::to_string(K));
    const int64_t padded = (N + 15) / 16 * 16, pairs = K / 2, blocks = K / kMxfp4BlockSize;
    // As above, targets without FMA run the matrix without the scale bytes 0 and 1.
    const LaneMatrix edges(padded, K, 8, true), plain(padded, K, 8, false);
    constexpr int64_t Tmax = 9;
    const TokenRows x(Tmax, K, 9);
    for_each_target([&](int64_t target) {
      const bool fma = target < HWY_SSE4;
      const LaneMatrix& full = fma ? edges : plain;
      // The row-major matrix is full's first N rows.
      const std::vector<uint8_t> codes(full.codes.begin(), full.codes.begin() + N * pairs),
          scales(full.scales.begin(), full.scales.begin() + N * blocks);
      for (const int64_t T : {int64_t{1}, int64_t{3}, int64_t{8}, Tmax}) {
        for (const bool bf16_tokens : {true, false}) {
          if (!bf16_tokens && !fma) continue;
          SCOPED_TRACE("T " + std::to_string(T) + (bf16_tokens ? " bf16" : " f32") + " tokens");
          const bf16* xh = bf16_tokens ? x.xh.data() : nullptr;
          const int64_t ldy = N + 2;
          std::vector<float> want(T * padded);
          mxfp4_lanes_ref(xh, x.xf.data(), T, full.lane_codes.data(), full.lane_scales.data(),
                          padded, K, 0, padded, want.data(), padded);
          for (const auto& [row0, end] :
               {std::pair<int64_t, int64_t>{0, N}, {3, N}, {16, N}, {0, N - 1}, {130, N}}) {
            if (row0 >= end || end > N) continue;
            for (const bool round : {false, true}) {
              std::vector<float> got(T * ldy, -1.0f);
              mxfp4_lanes_rows_row_major(xh, x.xf.data(), T, codes.data(), scales.data(), N, K,
                                         row0, end - row0, got.data(), ldy, round);
              std::vector<float> got_rows, want_rows;
              for (int64_t t = 0; t < T; ++t)
                for (int64_t n = row0; n < end; ++n) {
                  got_rows.push_back(got[t * ldy + n - row0]);
                  const float w = want[t * padded + n];
                  want_rows.push_back(round ? round_bf16(w) : w);
                }
              expect_same(got_rows, want_rows,
                          "rows " + std::to_string(row0) + ".." + std::to_string(end) +
                              (round ? " round_bf16" : ""));
              for (int64_t t = 0; t < T; ++t)  // nothing written past the call's rows
                for (int64_t n = end - row0; n < ldy; ++n) ASSERT_EQ(got[t * ldy + n], -1.0f);
            }
          }
        }
      }
    });
  }
}

// MXFP4 jobs (matmul.h) over the same matrix in the lane layout (kMxfp4Lanes, as the loader
// stores it) and row-major (kMxfp4, as a memory mapping holds it), with bf16 or f32 tokens, in
// one batch with a slice of the rows and a matrix without scale bytes 0 and 255 whose job claims
// so (normal_scales, as the loader's jobs do), at 1, 2 and 3 threads, unrounded and rounded to
// bf16 (round_bf16, which these jobs' tiles do as they store): all give the twin's bits (rounded),
// so where a model's experts reside never changes a logit, nor does the thread count.
TEST(Mxfp4Lanes, JobsInEitherLayoutGiveTheTwinsBits) {
  const int saved = parallel_threads();
  for (const auto& [N, K] : {std::pair<int64_t, int64_t>{16, 32}, {48, 96}, {304, 512}}) {
    const LaneMatrix m(N, K, 11, true), plain(N, K, 13, false);
    ASSERT_FALSE(m.normal);
    ASSERT_TRUE(plain.normal);
    for (const int64_t T : {1, 3, 8, 9}) {
      SCOPED_TRACE("N " + std::to_string(N) + " K " + std::to_string(K) + " T " +
                   std::to_string(T));
      const TokenRows x(T, K, 12);
      std::vector<float> want(T * N), want_plain(T * N);
      mxfp4_lanes_ref(x.xh.data(), nullptr, T, m.lane_codes.data(), m.lane_scales.data(), N, K, 0,
                      N, want.data(), N);
      mxfp4_lanes_ref(x.xh.data(), nullptr, T, plain.lane_codes.data(), plain.lane_scales.data(), N,
                      K, 0, N, want_plain.data(), N);
      for (const bool round : {false, true}) {
        if (round)
          for (std::vector<float>* w : {&want, &want_plain})
            for (float& v : *w) v = round_bf16(v);
        for (const int threads : {1, 2, 3}) {
          set_parallel_threads(threads);
          for (const bool bf16_tokens : {true, false}) {
            std::vector<float> lanes(T * N, -1.0f), rows(T * N, -1.0f), part(T * 16, -1.0f),
                normal(T * N, -1.0f);
            MatmulJob jobs[] = {
                mxfp4_job(x.x.data(), T, m.lane_codes.data(), m.lane_scales.data(), N, K,
                          lanes.data(), Layout::kMxfp4Lanes),
                mxfp4_job(x.x.data(), T, m.codes.data(), m.scales.data(), N, K, rows.data()),
                // rows [N - 16, N) of the row-major matrix: a job over a slice of rows
                mxfp4_job(x.x.data(), T, m.codes.data() + (N - 16) * (K / 2),
                          m.scales.data() + (N - 16) * (K / kMxfp4BlockSize), 16, K, part.data()),
                mxfp4_job(x.x.data(), T, plain.lane_codes.data(), plain.lane_scales.data(), N, K,
                          normal.data(), Layout::kMxfp4Lanes)};
            jobs[3].normal_scales = true;
            for (MatmulJob& j : jobs) j.round_bf16 = round;
            if (bf16_tokens)
              for (MatmulJob& j : jobs) j.xh = x.xh.data();
            matmul_batch(jobs, 4);
            const std::string what = std::to_string(threads) + " threads, " +
                                     (bf16_tokens ? "bf16" : "f32") + " tokens" +
                                     (round ? ", round_bf16" : "");
            expect_same(lanes, want, "lanes, " + what);
            expect_same(rows, want, "row-major, " + what);
            std::vector<float> want_part;
            for (int64_t t = 0; t < T; ++t)
              for (int64_t n = N - 16; n < N; ++n) want_part.push_back(want[t * N + n]);
            expect_same(part, want_part, "slice, " + what);
            expect_same(normal, want_plain, "normal_scales, " + what);
          }
        }
      }
    }
  }
  set_parallel_threads(saved);
}

TEST(Mxfp4Lanes, WithinTheRoundingBoundOfAnF64Evaluation) {
  const int64_t N = 32, K = 1024, T = 5;
  const LaneMatrix m(N, K, 6, false);
  const TokenRows x(T, K, 7);
  std::vector<float> y(T * N);
  mxfp4_lanes_rows(x.xh.data(), nullptr, T, m.lane_codes.data(), m.lane_scales.data(), N, K, 0, N,
                   y.data(), N, {.normal_scales = m.normal});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double exact = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(x.x[t * K + k]) *
                         mxfp4_get(m.codes.data() + n * (K / 2), m.scales.data() + n * (K / 32), k);
        exact += p;
        magnitude += std::fabs(p);
      }
      // Each product enters one block sum of 32 terms, then one accumulation over K / 32 blocks:
      // at most 32 + K / 32 roundings of at most u = 2^-24 of the running magnitude.
      const double bound = (32.0 + K / 32.0 + 2.0) * std::ldexp(1.0, -24) * magnitude;
      EXPECT_NEAR(y[t * N + n], exact, bound) << t << "," << n;
    }
}

}  // namespace
}  // namespace attnres
