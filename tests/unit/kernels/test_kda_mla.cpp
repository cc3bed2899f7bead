// Dispatched KDA (kda_hwy.cpp) and MLA (mla_hwy.cpp) kernels against their scalar twins
// (kda_recurrent_ref, kda_chunked_ref, mla_attend_expanded_ref, mla_attend_absorbed_ref) on every
// Highway target this CPU supports, over sizes that are and are not multiples of the vector
// widths (16, 17, 64, 128), and 1 vs 2 OpenMP threads bitwise.
//
// Tolerances (u = 2^-24). Both sides evaluate the same sums of products in f32 in different
// association (fused multiply-adds, register tiles) and with exp differing by a few ulp. We use
// the probabilistic rounding-error bound (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019): a
// computed sum of n terms is within lambda sqrt(n) u sum |terms| of the exact one with
// probability >= 1 - 2 exp(-lambda^2 / 2) per value; lambda = 8 (failure odds ~1e-14), which
// keeps the tolerances ~1e-4 relative instead of the worst case's vacuous ~1e-1.
//  - KDA: per token the state column j and the output are sums of at most dk + 3 terms whose
//    absolute sum is at most ||S_:j||_2 + |v_j| (|k| = 1, |q| = dk^-1/2, decay <= 1, beta < 1;
//    Cauchy-Schwarz). Differences from earlier steps are carried by a non-expansive map (decay
//    <= 1, I - beta k k^T with |k| = 1, 0 < beta < 1), so the per-step errors add up in
//    quadrature over the 2 T stages (recurrent) or 6 per chunk with sums of dk + C + 3 terms
//    (chunked: decays, A, UT transform, w/u, v_new, output, state update).
//  - MLA: a score is a sum of nope + rope terms; softmax turns a score error e into a relative
//    probability error <= 2e plus ~(n + 4) u; the output is a convex combination of values, so
//    |o - o_ref| <= (2 e + lambda sqrt(N + 4) u) max|v|. Absorbed adds two rank-r products
//    (q_lat = W_UK^T q_nope and o = W_UV o_lat), each within lambda sqrt(r) u sum |terms|.
#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "kernels/kda.h"
#include "kernels/mla.h"
#include "util/numeric.h"
#include "util/tensor.h"

namespace attnres {
namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24

template <class Body>
void for_each_target(const Body& body) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    body();
  }
  hwy::SetSupportedTargetsForTest(0);
}

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

double max_abs(const std::vector<float>& a) {
  double m = 0.0;
  for (float x : a) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

void expect_close(const std::vector<float>& y, const std::vector<float>& ref, double tol,
                  const char* what) {
  ASSERT_EQ(y.size(), ref.size());
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_TRUE(std::isfinite(y[i])) << what << " i=" << i;
    ASSERT_LE(std::fabs(static_cast<double>(y[i]) - ref[i]), tol)
        << what << " i=" << i << " y=" << y[i] << " ref=" << ref[i];
  }
}

// KDA inputs shaped like the model's: q, k unit rows (q scaled by dk^-1/2), per-step log decay
// g in [-5, 0] (the lower-bound gate's range) or, with `strong`, down to about -100 (the
// softplus gate without a bound: exercises the chunked form's exact fallback), beta in (0, 1).
struct KdaCase {
  int64_t T, H, dk, dv;
  std::vector<float> q, k, v, g, beta, s0;
  KdaCase(int64_t T_, int64_t H_, int64_t dk_, int64_t dv_, uint32_t seed, bool strong = false)
      : T(T_), H(H_), dk(dk_), dv(dv_) {
    q = randn(T * H * dk, seed);
    k = randn(T * H * dk, seed + 1);
    v = randn(T * H * dv, seed + 2);
    s0 = randn(H * dk * dv, seed + 3, 0.3f);
    auto unit = [&](std::vector<float>& x, float scale) {
      for (int64_t r = 0; r < T * H; ++r) {
        double ss = 0.0;
        for (int64_t i = 0; i < dk; ++i) ss += double{x[r * dk + i]} * x[r * dk + i];
        const float inv = static_cast<float>(scale / std::sqrt(ss + 1e-6));
        for (int64_t i = 0; i < dk; ++i) x[r * dk + i] *= inv;
      }
    };
    unit(q, 1.0f / std::sqrt(static_cast<float>(dk)));
    unit(k, 1.0f);
    std::mt19937 rng(seed + 4);
    std::uniform_real_distribution<float> gd(strong ? -100.0f : -5.0f, 0.0f);
    g.resize(q.size());
    for (auto& x : g) x = gd(rng) * (strong ? 1.0f : gd(rng) / -5.0f);  // mostly mild
    std::uniform_real_distribution<float> bd(0.01f, 0.99f);
    beta.resize(static_cast<size_t>(T * H));
    for (auto& b : beta) b = bd(rng);
  }
};

constexpr double kLambda = 8.0;

// Largest state column 2-norm the reference recurrence reaches (token by token: the twin is
// sequential per token, so T one-token calls are bitwise one T-token call).
double kda_column_bound(const KdaCase& c) {
  std::vector<float> s = c.s0, o(static_cast<size_t>(c.H * c.dv));
  auto col_max = [&] {
    double m = 0.0;
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t j = 0; j < c.dv; ++j) {
        double ss = 0.0;
        for (int64_t i = 0; i < c.dk; ++i) {
          const double x = s[static_cast<size_t>((h * c.dk + i) * c.dv + j)];
          ss += x * x;
        }
        m = std::max(m, std::sqrt(ss));
      }
    return m;
  };
  double m = col_max();
  for (int64_t t = 0; t < c.T; ++t) {
    kda_recurrent_ref(c.q.data() + t * c.H * c.dk, c.k.data() + t * c.H * c.dk,
                      c.v.data() + t * c.H * c.dv, c.g.data() + t * c.H * c.dk,
                      c.beta.data() + t * c.H, 1, c.H, c.dk, c.dv, s.data(), o.data());
    m = std::max(m, col_max());
  }
  return m;
}

// chunk = 0: the recurrent form.
double kda_tol(const KdaCase& c, int64_t chunk, double col) {
  const double n = static_cast<double>(c.dk + chunk + 3);
  const double stages =
      chunk ? 6.0 * static_cast<double>((c.T + chunk - 1) / chunk) : 2.0 * static_cast<double>(c.T);
  return kLambda * std::sqrt(n * stages) * kU * (col + max_abs(c.v));
}

struct KdaOut {
  std::vector<float> s, o;
};

KdaOut run_recurrent(const KdaCase& c, bool ref) {
  KdaOut r{c.s0, std::vector<float>(static_cast<size_t>(c.T * c.H * c.dv))};
  (ref ? kda_recurrent_ref : kda_recurrent)(c.q.data(), c.k.data(), c.v.data(), c.g.data(),
                                            c.beta.data(), c.T, c.H, c.dk, c.dv, r.s.data(),
                                            r.o.data());
  return r;
}

KdaOut run_chunked(const KdaCase& c, int64_t chunk, bool ref) {
  KdaOut r{c.s0, std::vector<float>(static_cast<size_t>(c.T * c.H * c.dv))};
  std::vector<float> scratch(static_cast<size_t>(kda_chunk_scratch_floats(c.H, chunk, c.dk, c.dv)));
  (ref ? kda_chunked_ref : kda_chunked)(c.q.data(), c.k.data(), c.v.data(), c.g.data(),
                                        c.beta.data(), c.T, c.H, c.dk, c.dv, chunk, r.s.data(),
                                        r.o.data(), scratch.data());
  return r;
}

TEST(KdaSimd, RecurrentMatchesScalarTwinOnEveryTarget) {
  for (int64_t dk : {16, 17, 64, 128}) {
    for (int64_t H : {1, 3}) {
      for (int64_t T : {1, 5, 70}) {
        const KdaCase c(T, H, dk, dk, static_cast<uint32_t>(dk * 100 + H * 10 + T));
        const KdaOut ref = run_recurrent(c, true);
        const double tol = kda_tol(c, 0, kda_column_bound(c));
        for_each_target([&] {
          SCOPED_TRACE(testing::Message() << "dk=" << dk << " H=" << H << " T=" << T);
          const KdaOut y = run_recurrent(c, false);
          expect_close(y.o, ref.o, tol, "o");
          expect_close(y.s, ref.s, tol, "state");
        });
      }
    }
  }
  // dk != dv, on both sides of a vector width.
  const KdaCase c(9, 2, 24, 40, 7);
  const KdaOut ref = run_recurrent(c, true);
  const double tol = kda_tol(c, 0, kda_column_bound(c));
  for_each_target([&] {
    const KdaOut y = run_recurrent(c, false);
    expect_close(y.o, ref.o, tol, "o");
    expect_close(y.s, ref.s, tol, "state");
  });
}

TEST(KdaSimd, ChunkedMatchesScalarTwinOnEveryTarget) {
  for (int64_t dk : {16, 17, 64, 128}) {
    for (int64_t H : {1, 3}) {
      for (int64_t T : {1, 5, 70}) {
        const KdaCase c(T, H, dk, dk, static_cast<uint32_t>(dk * 100 + H * 10 + T + 5000));
        const double col = kda_column_bound(c);
        for (int64_t chunk : {16, 64}) {
          const KdaOut ref = run_chunked(c, chunk, true);
          const double tol = kda_tol(c, chunk, col);
          for_each_target([&] {
            SCOPED_TRACE(testing::Message()
                         << "dk=" << dk << " H=" << H << " T=" << T << " chunk=" << chunk);
            const KdaOut y = run_chunked(c, chunk, false);
            expect_close(y.o, ref.o, tol, "o");
            expect_close(y.s, ref.s, tol, "state");
          });
        }
      }
    }
  }
}

// Decays beyond the factored form's range: the exact pairwise fallback of both sides, and a
// chunk length that is not a multiple of the sub-block, against the recurrent definition too.
TEST(KdaSimd, ChunkedStrongDecayAndOddChunk) {
  const KdaCase c(70, 2, 17, 20, 81, /*strong=*/true);
  const double col = kda_column_bound(c);
  const KdaOut rec = run_recurrent(c, true);
  for (int64_t chunk : {16, 37}) {
    const KdaOut ref = run_chunked(c, chunk, true);
    const double tol = kda_tol(c, chunk, col);
    for_each_target([&] {
      SCOPED_TRACE(testing::Message() << "chunk=" << chunk);
      const KdaOut y = run_chunked(c, chunk, false);
      expect_close(y.o, ref.o, tol, "o");
      expect_close(y.s, ref.s, tol, "state");
      expect_close(y.o, rec.o, tol, "o vs recurrent");
      expect_close(y.s, rec.s, tol, "state vs recurrent");
    });
  }
}

// One call over T tokens equals T one-token calls bitwise (the recurrent kernel's value of a
// token does not depend on how the sequence is split), and a chunked prefill split at a chunk
// boundary carries its state exactly.
TEST(KdaSimd, SplitSequenceIsBitwiseTheSame) {
  const KdaCase c(12, 3, 33, 33, 91);
  const KdaOut full = run_recurrent(c, false);
  std::vector<float> s = c.s0, o(full.o.size());
  for (int64_t t = 0; t < c.T; ++t)
    kda_recurrent(c.q.data() + t * c.H * c.dk, c.k.data() + t * c.H * c.dk,
                  c.v.data() + t * c.H * c.dv, c.g.data() + t * c.H * c.dk, c.beta.data() + t * c.H,
                  1, c.H, c.dk, c.dv, s.data(), o.data() + t * c.H * c.dv);
  EXPECT_EQ(0, std::memcmp(o.data(), full.o.data(), o.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(s.data(), full.s.data(), s.size() * sizeof(float)));
}

TEST(KdaSimd, ThreadCountInvariant) {
  const int saved = omp_get_max_threads();
  const KdaCase c(70, 3, 128, 128, 123);  // above the parallel cutoff in both kernels
  omp_set_num_threads(1);
  const KdaOut r1 = run_recurrent(c, false), c1 = run_chunked(c, 64, false);
  omp_set_num_threads(2);
  const KdaOut r2 = run_recurrent(c, false), c2 = run_chunked(c, 64, false);
  omp_set_num_threads(saved);
  EXPECT_EQ(0, std::memcmp(r1.o.data(), r2.o.data(), r1.o.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(r1.s.data(), r2.s.data(), r1.s.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(c1.o.data(), c2.o.data(), c1.o.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(c1.s.data(), c2.s.data(), c1.s.size() * sizeof(float)));
}

}  // namespace
}  // namespace attnres
