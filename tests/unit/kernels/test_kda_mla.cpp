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
#include "util/parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/absorbed_weights.h"
#include "kernels/hwy_targets.h"
#include "kernels/kda.h"
#include "kernels/mla.h"
#include "util/numeric.h"
#include "util/tensor.h"

namespace attnres {
namespace {

constexpr double kU = 1.0 / 16777216.0;  // 2^-24

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
  const int saved = parallel_threads();
  const KdaCase c(70, 3, 128, 128, 123);  // above the parallel cutoff in both kernels
  set_parallel_threads(1);
  const KdaOut r1 = run_recurrent(c, false), c1 = run_chunked(c, 64, false);
  set_parallel_threads(2);
  const KdaOut r2 = run_recurrent(c, false), c2 = run_chunked(c, 64, false);
  set_parallel_threads(saved);
  EXPECT_EQ(0, std::memcmp(r1.o.data(), r2.o.data(), r1.o.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(r1.s.data(), r2.s.data(), r1.s.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(c1.o.data(), c2.o.data(), c1.o.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(c1.s.data(), c2.s.data(), c1.s.size() * sizeof(float)));
}

// ---------------------------------------------------------------------------------------------
// MLA

TensorView weight_view(const std::vector<float>& f32, const std::vector<bf16>& b16, bool use_bf16,
                       int64_t rows, int64_t cols) {
  TensorView t;
  t.dtype = use_bf16 ? DType::kBF16 : DType::kF32;
  t.shape = {rows, cols};
  t.data = use_bf16 ? reinterpret_cast<const std::byte*>(b16.data())
                    : reinterpret_cast<const std::byte*>(f32.data());
  t.nbytes = static_cast<size_t>(rows * cols) * (use_bf16 ? sizeof(bf16) : sizeof(float));
  return t;
}

struct MlaCase {
  MlaDims d;
  int64_t N, T;
  std::vector<float> q, c_kv, k_rot, kv, w;  // kv [N, H, nope + v] (expanded), w = kv_b_proj
  std::vector<bf16> w16;
  MlaCase(int64_t H, int64_t nope, int64_t rope, int64_t v, int64_t r, int64_t N_, int64_t T_,
          uint32_t seed)
      : d{H, nope, rope, v, r, 1.0f / std::sqrt(static_cast<float>(nope + rope))}, N(N_), T(T_) {
    q = randn(T * H * (nope + rope), seed, 2.0f);
    c_kv = randn(N * r, seed + 1);
    k_rot = randn(N * rope, seed + 2);
    kv = randn(N * H * (nope + v), seed + 3);
    w = randn(H * (nope + v) * r, seed + 4, 0.2f);
    w16.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w16[i] = f32_to_bf16(w[i]);
      w[i] = bf16_to_f32(w16[i]);  // the same values in both storages
    }
  }
  double lambda_u(double n) const { return kLambda * std::sqrt(n) * kU; }
  // Expanded: e = score error bound; tol = 2 (2 e + 2 lambda sqrt(N + 4) u) max|v|.
  double expanded_tol() const {
    const int64_t qw = d.nope + d.rope, kvw = d.nope + d.v;
    double qmax = 0.0, kmax = 0.0, vmax = 0.0;
    for (int64_t i = 0; i < T * d.H; ++i) {
      double ss = 0.0;
      for (int64_t c = 0; c < qw; ++c) ss += double{q[i * qw + c]} * q[i * qw + c];
      qmax = std::max(qmax, std::sqrt(ss));
    }
    for (int64_t j = 0; j < N; ++j)
      for (int64_t h = 0; h < d.H; ++h) {
        double ss = 0.0;
        const float* kj = kv.data() + (j * d.H + h) * kvw;
        for (int64_t c = 0; c < d.nope; ++c) ss += double{kj[c]} * kj[c];
        for (int64_t c = 0; c < d.rope; ++c)
          ss += double{k_rot[j * d.rope + c]} * k_rot[j * d.rope + c];
        kmax = std::max(kmax, std::sqrt(ss));
        for (int64_t c = 0; c < d.v; ++c) vmax = std::max(vmax, double{std::fabs(kj[d.nope + c])});
      }
    const double e = lambda_u(static_cast<double>(qw)) * d.scale * qmax * kmax;
    return 2.0 * (2.0 * e + 2.0 * lambda_u(static_cast<double>(N + 4))) * vmax;
  }
  // Absorbed: score terms sum_c |q_lat_c||c_kv_c| + |q_rot||k_rot| with |q_lat| <= sum_i |q_i W|;
  // o_lat as above with max|c_kv|; o = W_UV o_lat adds the row 1-norm of W_UV times that error
  // plus lambda sqrt(r) u.
  double absorbed_tol() const {
    const int64_t qw = d.nope + d.rope, kvw = d.nope + d.v;
    double smax = 0.0, cmax = max_abs(c_kv), w1 = 0.0;
    std::vector<double> ql(static_cast<size_t>(d.r));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < d.H; ++h) {
        const float* qt = q.data() + (t * d.H + h) * qw;
        std::fill(ql.begin(), ql.end(), 0.0);
        for (int64_t i = 0; i < d.nope; ++i)
          for (int64_t c = 0; c < d.r; ++c)
            ql[static_cast<size_t>(c)] += std::fabs(double{qt[i]} * w[(h * kvw + i) * d.r + c]);
        for (int64_t j = 0; j < N; ++j) {
          double s = 0.0;
          for (int64_t c = 0; c < d.r; ++c)
            s += ql[static_cast<size_t>(c)] * std::fabs(c_kv[j * d.r + c]);
          for (int64_t c = 0; c < d.rope; ++c)
            s += std::fabs(double{qt[d.nope + c]} * k_rot[j * d.rope + c]);
          smax = std::max(smax, s);
        }
      }
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t e = 0; e < d.v; ++e) {
        double a = 0.0;
        for (int64_t c = 0; c < d.r; ++c) a += std::fabs(w[(h * kvw + d.nope + e) * d.r + c]);
        w1 = std::max(w1, a);
      }
    const double e = lambda_u(static_cast<double>(d.nope + d.r + d.rope)) * d.scale * smax;
    const double olat = (2.0 * e + 2.0 * lambda_u(static_cast<double>(N + 4))) * cmax;
    return 2.0 * w1 * (olat + lambda_u(static_cast<double>(d.r)) * cmax);
  }
  std::vector<float> expanded(bool ref) const {
    std::vector<float> o(static_cast<size_t>(T * d.H * d.v));
    std::vector<float> s(static_cast<size_t>(mla_expanded_scratch_floats(N, T)));
    (ref ? mla_attend_expanded_ref : mla_attend_expanded)(d, q.data(), T, kv.data(), k_rot.data(),
                                                          N, o.data(), s.data());
    return o;
  }
  // The absorbed form (scalar twin when ref; f32 or bf16 context) on this case's q and weights.
  template <typename C>
  std::vector<float> run_absorbed(bool ref, const C* ctx_c, const C* ctx_k, bool use_bf16) const {
    std::vector<float> o(static_cast<size_t>(T * d.H * d.v));
    std::vector<float> s(static_cast<size_t>(mla_absorbed_scratch_floats(d, N, T)));
    const TestAbsorbedWeights W(weight_view(w, w16, use_bf16, d.H * (d.nope + d.v), d.r), d);
    if constexpr (std::is_same_v<C, float>) {
      if (ref) {
        mla_attend_absorbed_ref(d, q.data(), T, ctx_c, ctx_k, N, W.view(), o.data(), s.data());
        return o;
      }
    }
    mla_attend_absorbed(d, q.data(), T, ctx_c, ctx_k, N, W.view(), o.data(), s.data());
    return o;
  }
  std::vector<float> absorbed(bool ref, bool use_bf16) const {
    return run_absorbed(ref, c_kv.data(), k_rot.data(), use_bf16);
  }
  // The fast absorbed form on the context rounded to bf16: read in place as bf16 (in_place) or
  // widened to f32 first.
  std::vector<float> absorbed_bf16_context(bool in_place) const {
    std::vector<bf16> c16(c_kv.size()), k16(k_rot.size());
    std::vector<float> cw(c_kv.size()), kw(k_rot.size());
    for (size_t i = 0; i < c_kv.size(); ++i) cw[i] = bf16_to_f32(c16[i] = f32_to_bf16(c_kv[i]));
    for (size_t i = 0; i < k_rot.size(); ++i) kw[i] = bf16_to_f32(k16[i] = f32_to_bf16(k_rot[i]));
    return in_place ? run_absorbed(false, c16.data(), k16.data(), true)
                    : run_absorbed(false, cw.data(), kw.data(), true);
  }
};

struct MlaShape {
  int64_t H, nope, rope, v, r;
};
// r = 300: o_lat's whole column tiles, single vectors and a ragged end; the odd nope and r (17):
// the absorbed weights row-major, the even ones lane-packed (BF16) with partial lane groups.
constexpr MlaShape kMlaShapes[] = {{1, 16, 0, 16, 16},
                                   {3, 17, 5, 17, 17},
                                   {3, 64, 16, 64, 64},
                                   {1, 128, 64, 128, 70},
                                   {2, 24, 8, 16, 300}};

TEST(MlaSimd, ExpandedMatchesScalarTwinOnEveryTarget) {
  for (const MlaShape& sh : kMlaShapes) {
    for (int64_t N : {1, 7, 100}) {
      for (int64_t T : {int64_t{1}, std::min<int64_t>(N, 6), N}) {
        const MlaCase c(sh.H, sh.nope, sh.rope, sh.v, sh.r, N, T,
                        static_cast<uint32_t>(sh.nope * 1000 + N * 10 + T));
        const std::vector<float> ref = c.expanded(true);
        const double tol = c.expanded_tol();
        for_each_target([&] {
          SCOPED_TRACE(testing::Message()
                       << "nope=" << sh.nope << " rope=" << sh.rope << " N=" << N << " T=" << T);
          expect_close(c.expanded(false), ref, tol, "o");
        });
      }
    }
  }
}

TEST(MlaSimd, AbsorbedMatchesScalarTwinOnEveryTarget) {
  for (const MlaShape& sh : kMlaShapes) {
    for (int64_t N : {1, 7, 100}) {
      for (int64_t T : {int64_t{1}, std::min<int64_t>(N, 3)}) {
        const MlaCase c(sh.H, sh.nope, sh.rope, sh.v, sh.r, N, T,
                        static_cast<uint32_t>(sh.r * 1000 + N * 10 + T));
        const double tol = c.absorbed_tol();
        for (bool use_bf16 : {false, true}) {
          const std::vector<float> ref = c.absorbed(true, use_bf16);
          for_each_target([&] {
            SCOPED_TRACE(testing::Message() << "r=" << sh.r << " rope=" << sh.rope << " N=" << N
                                            << " T=" << T << " bf16=" << use_bf16);
            expect_close(c.absorbed(false, use_bf16), ref, tol, "o");
          });
        }
      }
    }
  }
}

// A bf16 latent cache read in place gives bitwise what the widened copy gives (decode reads the
// cache in place; prefill and f32 / fp8 caches widen it).
TEST(MlaSimd, AbsorbedBf16ContextInPlaceEqualsWidened) {
  for (const MlaShape& sh : kMlaShapes) {
    for (int64_t N : {1, 7, 100}) {
      for (int64_t T : {int64_t{1}, std::min<int64_t>(N, 3)}) {
        const MlaCase c(sh.H, sh.nope, sh.rope, sh.v, sh.r, N, T,
                        static_cast<uint32_t>(sh.r * 100 + N * 10 + T));
        for_each_target([&] {
          SCOPED_TRACE(testing::Message()
                       << "r=" << sh.r << " rope=" << sh.rope << " N=" << N << " T=" << T);
          const std::vector<float> a = c.absorbed_bf16_context(true);
          const std::vector<float> b = c.absorbed_bf16_context(false);
          ASSERT_EQ(a.size(), b.size());
          EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
        });
      }
    }
  }
}

// The decoding rows of a step in one absorbed pass (mla_attend_absorbed_rows): every row is
// bitwise what mla_attend_absorbed gives it alone on its contiguous context, whatever the other
// rows, their contexts, the page size (1, 3, 64: rows split across pages) and the context type.
template <typename C>
C to_context(float x) {
  if constexpr (std::is_same_v<C, bf16>)
    return f32_to_bf16(x);
  else
    return x;
}

template <typename C>
void expect_rows_equal_alone(const MlaShape& sh, bool use_bf16_w, int64_t page_rows) {
  const int64_t contexts[] = {1, 5, 64, 65, 130};
  const int64_t n = 5;
  std::vector<MlaCase> cases;
  for (int64_t i = 0; i < n; ++i)
    cases.emplace_back(sh.H, sh.nope, sh.rope, sh.v, sh.r, contexts[i], 1,
                       static_cast<uint32_t>(900 + i * 7 + sh.r));
  // Every case shares case 0's kv_b_proj (one layer's weights for the whole step).
  const MlaCase& w0 = cases[0];
  const MlaDims& d = w0.d;
  const TestAbsorbedWeights W(weight_view(w0.w, w0.w16, use_bf16_w, sh.H * (sh.nope + sh.v), sh.r),
                              d);
  std::vector<std::vector<C>> ctx_c(n), ctx_k(n);
  std::vector<std::vector<const C*>> pages(n);
  std::vector<AbsorbedRow<C>> rows(n);
  std::vector<std::vector<float>> out(n), alone(n);
  for (int64_t i = 0; i < n; ++i) {
    const MlaCase& c = cases[static_cast<size_t>(i)];
    const int64_t N = contexts[i];
    for (float x : c.c_kv) ctx_c[i].push_back(to_context<C>(x));
    for (float x : c.k_rot) ctx_k[i].push_back(to_context<C>(x));
    const int64_t pr = page_rows > 0 ? page_rows : N, np = (N + pr - 1) / pr;
    for (int64_t k = 0; k < np; ++k) pages[i].push_back(ctx_c[i].data() + k * pr * d.r);
    for (int64_t k = 0; k < np; ++k) pages[i].push_back(ctx_k[i].data() + k * pr * d.rope);
    out[i].assign(static_cast<size_t>(d.H * d.v), 0.0f);
    rows[i].q = c.q.data();
    rows[i].c_kv = PagedRows<C>{pages[i].data(), pr, d.r, N};
    rows[i].k_rot = PagedRows<C>{pages[i].data() + np, pr, d.rope, N};
    rows[i].o = out[i].data();
    alone[i].assign(out[i].size(), 0.0f);
    std::vector<float> s(static_cast<size_t>(mla_absorbed_scratch_floats(d, N, 1)));
    mla_attend_absorbed(d, c.q.data(), 1, ctx_c[i].data(), ctx_k[i].data(), N, W.view(),
                        alone[i].data(), s.data());
  }
  std::vector<float> s(
      static_cast<size_t>(mla_absorbed_rows_scratch_floats(d, contexts, n, page_rows)));
  mla_attend_absorbed_rows(d, rows.data(), n, W.view(), s.data());
  for (int64_t i = 0; i < n; ++i)
    EXPECT_EQ(0, std::memcmp(out[i].data(), alone[i].data(), out[i].size() * sizeof(float)))
        << "row " << i << " (context " << contexts[i] << ") pages of " << page_rows;
}

TEST(MlaSimd, AbsorbedRowsOfAStepEqualEachRowAlone) {
  for (const MlaShape& sh : kMlaShapes)
    for (int64_t pr : {0, 1, 3, 64})
      for_each_target([&] {
        SCOPED_TRACE(testing::Message() << "r=" << sh.r << " pages=" << pr);
        expect_rows_equal_alone<float>(sh, false, pr);
        expect_rows_equal_alone<bf16>(sh, true, pr);
      });
}

TEST(MlaSimd, ThreadCountInvariant) {
  const int saved = parallel_threads();
  const MlaCase c(8, 64, 16, 64, 256, 100, 100, 77);  // above both kernels' parallel cutoffs
  const MlaCase a(8, 64, 16, 64, 256, 100, 1, 78);
  set_parallel_threads(1);
  const std::vector<float> e1 = c.expanded(false), a1 = a.absorbed(false, true);
  set_parallel_threads(2);
  const std::vector<float> e2 = c.expanded(false), a2 = a.absorbed(false, true);
  set_parallel_threads(saved);
  EXPECT_EQ(0, std::memcmp(e1.data(), e2.data(), e1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a1.data(), a2.data(), a1.size() * sizeof(float)));
}

}  // namespace
}  // namespace attnres
