// Dispatched row kernels against their scalar twins, on every Highway target this CPU supports:
// rms_norm / l2_norm / gated_rms_norm (norm_hwy.cpp), route_sigmoid_topk (router_hwy.cpp),
// causal_conv1d_silu / kda_gate (conv_gate_hwy.cpp), silu_mul (silu_hwy.cpp) and moe_combine
// (moe_combine_hwy.cpp). Lengths on and off every vector width, bf16 output, aliasing, saturated
// and special inputs, inputs whose sums are exact (where the fast path must then be bitwise the
// twin), and 1 vs 2 threads.
//
// Tolerances are ulp distances (adjacent floats are 1 apart; +0 and -0 are 0 apart), derived
// from the documented error of Highway's Exp (<= 1 ulp) and Log1p (<= 2 ulp) against glibc's
// expf / log1pf (< 1 ulp each), or from the reordering of a sum of squares.
#include <gtest/gtest.h>
#include "util/parallel.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "kernels/activation.h"
#include "kernels/conv_gate.h"
#include "kernels/hwy_targets.h"
#include "kernels/moe_combine.h"
#include "kernels/norm.h"
#include "kernels/parallel.h"
#include "kernels/router.h"
#include "util/numeric.h"

namespace attnres {
namespace {

// Runs body with exactly `threads` OpenMP threads, restoring the previous setting.
template <class Body>
void with_threads(int threads, const Body& body) {
  const int saved = parallel_threads();
  set_parallel_threads(threads);
  body();
  set_parallel_threads(saved);
}

const int64_t kLengths[] = {1, 3, 15, 16, 17, 33, 127, 128, 1000, 7168};

// Distance in representable floats (monotone integer image of the bits; +0 == -0).
int64_t ulp_distance(float a, float b) {
  auto key = [](float f) {
    const int32_t i = std::bit_cast<int32_t>(f);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  const int64_t d = key(a) - key(b);
  return d < 0 ? -d : d;
}

// One bf16 ulp in f32 ulps: two bf16 values next to each other are 2^16 floats apart.
constexpr int64_t kBf16Ulp = int64_t{1} << 16;

void expect_ulps(const std::vector<float>& y, const std::vector<float>& ref, int64_t max_ulps) {
  ASSERT_EQ(y.size(), ref.size());
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_LE(ulp_distance(y[i], ref[i]), max_ulps)
        << "i=" << i << " y=" << y[i] << " ref=" << ref[i];
}

void expect_bitwise(const std::vector<float>& y, const std::vector<float>& ref) {
  ASSERT_EQ(y.size(), ref.size());
  for (size_t i = 0; i < y.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(ref[i]))
        << "i=" << i << " y=" << y[i] << " ref=" << ref[i];
}

void expect_bf16_values(const std::vector<float>& y) {
  for (float v : y) ASSERT_EQ(std::bit_cast<uint32_t>(v), std::bit_cast<uint32_t>(round_bf16(v)));
}

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Values k / 8 with |k| <= 8: every square and every partial sum of up to 2^17 squares is a
// multiple of 2^-6 below 2^13, exact in f32, so any summation order gives the same sum.
std::vector<float> exact_sum_values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> k(-8, 8);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(k(rng)) / 8.0f;
  return v;
}

// A 1-D gain view over f32 or bf16 storage (bf16 holds the f32 values rounded).
struct Gain {
  std::vector<float> f32;
  std::vector<bf16> b16;
  TensorView view;
  Gain(int64_t D, int kind, uint32_t seed) {
    f32 = randn(D, seed, 0.5f);
    for (float& g : f32) g += 1.0f;
    view.shape = {D};
    if (kind == 1) {
      view.dtype = DType::kF32;
      view.data = reinterpret_cast<const std::byte*>(f32.data());
      view.nbytes = f32.size() * sizeof(float);
    } else if (kind == 2) {
      for (float g : f32) b16.push_back(f32_to_bf16(g));
      view.dtype = DType::kBF16;
      view.data = reinterpret_cast<const std::byte*>(b16.data());
      view.nbytes = b16.size() * sizeof(bf16);
    }
  }
};

// --- norms -------------------------------------------------------------------------------

// Sum-of-squares reordering: each sum of D non-negative terms (sequential in the twin,
// lane-parallel here) is within gamma_D ~ D u of the exact sum (u = 2^-24), so the two sums
// differ by <= 2 D u relative and the rsqrt by <= D u. A relative difference e is at most e / u
// ulps, so that is <= D ulps; the later roundings (/D, +eps, sqrt, 1/x, the products) may each
// round the two slightly different values apart by one more ulp: D + 8 ulps bounds the f32
// output. bf16 output rounds once (gated) or twice (rms_norm with a gain), each time possibly
// to the neighbouring bf16 value: 2 bf16 ulps.
int64_t norm_ulps(int64_t D, bool bf16_out) {
  return bf16_out ? 2 * kBf16Ulp : D + 8;
}

TEST(RowNorms, RmsNormMatchesTwin) {
  for_each_target([] {
    for (int64_t D : kLengths) {
      const int64_t rows = 3;
      std::vector<float> x = randn(rows * D, static_cast<uint32_t>(D), 2.0f);
      for (int kind : {0, 1, 2}) {
        const Gain gain(D, kind, static_cast<uint32_t>(D + 1));
        for (bool bf : {false, true}) {
          SCOPED_TRACE(testing::Message() << "D=" << D << " gain=" << kind << " bf16=" << bf);
          std::vector<float> y(x.size()), ref(x.size());
          rms_norm(x.data(), rows, D, gain.view, 1e-5f, bf, y.data());
          rms_norm_ref(x.data(), rows, D, gain.view, 1e-5f, bf, ref.data());
          expect_ulps(y, ref, norm_ulps(D, bf));
          if (bf) expect_bf16_values(y);
          std::vector<float> inplace = x;
          rms_norm(inplace.data(), rows, D, gain.view, 1e-5f, bf, inplace.data());
          expect_bitwise(inplace, y);
        }
      }
    }
  });
}

TEST(RowNorms, L2NormMatchesTwin) {
  for_each_target([] {
    for (int64_t D : kLengths) {
      const int64_t rows = 3;
      std::vector<float> x = randn(rows * D, static_cast<uint32_t>(D + 7), 3.0f);
      for (float scale : {1.0f, 0.08838835f}) {
        SCOPED_TRACE(testing::Message() << "D=" << D << " scale=" << scale);
        std::vector<float> y(x.size()), ref(x.size());
        l2_norm(x.data(), rows, D, 1e-6f, scale, y.data());
        l2_norm_ref(x.data(), rows, D, 1e-6f, scale, ref.data());
        expect_ulps(y, ref, norm_ulps(D, false));
        std::vector<float> inplace = x;
        l2_norm(inplace.data(), rows, D, 1e-6f, scale, inplace.data());
        expect_bitwise(inplace, y);
      }
    }
  });
}

// The gate's sigmoid adds <= 4 ulps (Exp vs expf <= 2 ulps between them, shrunk by
// e / (1 + e) <= 1 in 1 + e, plus the roundings of the add and the divide) and one more
// rounding in the last product.
TEST(RowNorms, GatedRmsNormMatchesTwin) {
  for_each_target([] {
    for (int64_t D : kLengths) {
      const int64_t rows = 3;
      std::vector<float> o = randn(rows * D, static_cast<uint32_t>(D + 3));
      std::vector<float> gate = randn(rows * D, static_cast<uint32_t>(D + 4), 4.0f);
      // Saturated gates: sigmoid 1, a normal tail, subnormal, exactly 0.
      const float wide[] = {30.0f, -30.0f, -80.0f, -87.5f, -88.5f, -95.0f, -200.0f, 200.0f};
      for (size_t i = 0; i < gate.size(); i += 5) gate[i] = wide[(i / 5) % 8];
      for (int kind : {1, 2}) {
        const Gain gain(D, kind, static_cast<uint32_t>(D + 5));
        for (bool bf : {false, true}) {
          SCOPED_TRACE(testing::Message() << "D=" << D << " gain=" << kind << " bf16=" << bf);
          std::vector<float> y(o.size()), ref(o.size());
          gated_rms_norm(o.data(), gate.data(), rows, D, gain.view, 1e-5f, bf, y.data());
          gated_rms_norm_ref(o.data(), gate.data(), rows, D, gain.view, 1e-5f, bf, ref.data());
          expect_ulps(y, ref, bf ? 2 * kBf16Ulp : norm_ulps(D, false) + 5);
          if (bf) expect_bf16_values(y);
          std::vector<float> inplace = o;
          gated_rms_norm(inplace.data(), gate.data(), rows, D, gain.view, 1e-5f, bf,
                         inplace.data());
          expect_bitwise(inplace, y);
        }
      }
    }
  });
}

// With exact sums of squares every other step is the twin's IEEE operation on the same
// values, so the outputs are bitwise the twin's; gates 0 and +-200 give sigmoids exactly 0.5,
// 1 and 0 in both. Also zero rows (inv = 1/sqrt(eps), outputs 0) and rows whose sum of
// squares overflows to inf (inv = 0, outputs 0).
TEST(RowNorms, BitwiseWhenSumsAreExact) {
  for_each_target([] {
    for (int64_t D : kLengths) {
      const int64_t rows = 4;
      std::vector<float> x = exact_sum_values(rows * D, static_cast<uint32_t>(D));
      for (int64_t i = 0; i < D; ++i) x[static_cast<size_t>(D + i)] = 0.0f;  // row 1: zeros
      for (int64_t i = 0; i < D; ++i) x[static_cast<size_t>(2 * D + i)] = i % 2 ? 3e19f : -4e19f;
      std::vector<float> gate(x.size());
      for (size_t i = 0; i < gate.size(); ++i)
        gate[i] = i % 3 == 0 ? 0.0f : (i % 3 == 1 ? 200.0f : -200.0f);
      for (int kind : {0, 1, 2}) {
        const Gain gain(D, kind, static_cast<uint32_t>(D + 9));
        for (bool bf : {false, true}) {
          SCOPED_TRACE(testing::Message() << "D=" << D << " gain=" << kind << " bf16=" << bf);
          std::vector<float> y(x.size()), ref(x.size());
          rms_norm(x.data(), rows, D, gain.view, 1e-5f, bf, y.data());
          rms_norm_ref(x.data(), rows, D, gain.view, 1e-5f, bf, ref.data());
          expect_bitwise(y, ref);
          if (kind == 0) continue;
          gated_rms_norm(x.data(), gate.data(), rows, D, gain.view, 1e-5f, bf, y.data());
          gated_rms_norm_ref(x.data(), gate.data(), rows, D, gain.view, 1e-5f, bf, ref.data());
          expect_bitwise(y, ref);
        }
      }
      std::vector<float> y(x.size()), ref(x.size());
      l2_norm(x.data(), rows, D, 1e-6f, 0.25f, y.data());
      l2_norm_ref(x.data(), rows, D, 1e-6f, 0.25f, ref.data());
      expect_bitwise(y, ref);
    }
  });
}

// round_to_bf16 gives its twin's bits for every length (vector body and ragged end), including
// ties (both directions), the largest finite values (which round to inf), subnormals, signed
// zeros and NaNs, on any thread count (a length past kParallelMinWork is split over the
// threads); disabled, it leaves the values alone.
TEST(RowNorms, RoundToBf16MatchesTwin) {
  const uint32_t specials[] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xff7fffffu,
                               0x00000001u, 0x80400001u, 0x00000000u, 0x80000000u,
                               0x7f800000u, 0x7fc00001u, 0xff800001u, 0x3f7fffffu};
  std::mt19937 rng(3);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<int64_t> lengths(std::begin(kLengths), std::end(kLengths));
  lengths.push_back(3 * kParallelMinWork + 5);
  for_each_target([&] {
    for (int64_t n : lengths) {
      std::vector<float> x(static_cast<size_t>(n));
      for (size_t i = 0; i < x.size(); ++i)
        x[i] =
            std::bit_cast<float>(i % 3 == 0 ? specials[(i / 3) % std::size(specials)] : bits(rng));
      std::vector<float> ref = x;
      round_to_bf16_ref(ref.data(), n, true);
      for (int threads : {1, 3}) {
        std::vector<float> y = x, off = x;
        with_threads(threads, [&] {
          round_to_bf16(y.data(), n, true);
          round_to_bf16(off.data(), n, false);
        });
        SCOPED_TRACE(testing::Message() << "n=" << n << " threads=" << threads);
        expect_bitwise(y, ref);
        expect_bitwise(off, x);
      }
    }
  });
}

TEST(RowNorms, ThreadCountInvariant) {
  const int64_t rows = 40, D = 7168;  // rows * D above kParallelMinWork
  static_assert(40 * 7168 > kParallelMinWork);
  std::vector<float> x = randn(rows * D, 5), gate = randn(rows * D, 6, 3.0f);
  const Gain gain(D, 2, 7);
  std::vector<float> base[3], y[3];
  for (int threads : {1, 2}) {
    std::vector<float>* out = threads == 1 ? base : y;
    with_threads(threads, [&] {
      for (int k = 0; k < 3; ++k) out[k].assign(x.size(), 0.0f);
      rms_norm(x.data(), rows, D, gain.view, 1e-5f, true, out[0].data());
      l2_norm(x.data(), rows * 56, 128, 1e-6f, 0.5f, out[1].data());
      gated_rms_norm(x.data(), gate.data(), rows * 56, 128, Gain(128, 1, 8).view, 1e-5f, false,
                     out[2].data());
    });
  }
  for (int k = 0; k < 3; ++k) expect_bitwise(y[k], base[k]);
}

// --- router ------------------------------------------------------------------------------

struct RouterCase {
  int64_t T, E, K;
  bool with_bias;
  RouterOptions opt;
};

struct RouterOut {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

template <class Fn>
RouterOut run_router(Fn fn, const std::vector<float>& logits, const std::vector<float>& bias,
                     const RouterCase& c) {
  RouterOut r{std::vector<int32_t>(static_cast<size_t>(c.T * c.K)),
              std::vector<float>(static_cast<size_t>(c.T * c.K))};
  std::vector<float> scratch(static_cast<size_t>(c.T * c.E));
  fn(logits.data(), c.with_bias ? bias.data() : nullptr, c.T, c.E, c.opt, r.ids.data(), r.w.data(),
     scratch.data());
  return r;
}

// top_k 1, 8, 16 (clamped to E) and, with `all`, E; four option sets.
std::vector<RouterCase> router_cases(int64_t T, int64_t E, bool all) {
  std::vector<RouterCase> cases;
  for (int64_t K : {int64_t{1}, std::min<int64_t>(8, E), std::min<int64_t>(16, E), E}) {
    if (K == E && !all) continue;
    for (int variant = 0; variant < 4; ++variant) {
      RouterCase c{T, E, K, variant != 3, {}};
      c.opt.top_k = K;
      c.opt.renormalize = variant != 1;
      c.opt.scaling = variant == 2 ? 2.5f : 1.0f;
      c.opt.bias_in_weights = variant == 2;
      cases.push_back(c);
    }
  }
  return cases;
}

// Scores exactly representable in both paths (sigmoid(0) = 0.5, sigmoid(+-200) = 1 / 0) and
// dyadic biases: many exact ties, so the selection order (descending biased score, lower id
// first) is checked bit for bit, ids and weights.
TEST(RouterKernelFast, IdenticalToTwinOnExactScoresAndTies) {
  for_each_target([] {
    for (int64_t E : {1, 3, 15, 16, 17, 33, 127, 128, 384, 896}) {
      const int64_t T = 3;
      std::mt19937 rng(static_cast<uint32_t>(E));
      std::uniform_int_distribution<int> pick(0, 2), bpick(-2, 2);
      std::vector<float> logits(static_cast<size_t>(T * E)), bias(static_cast<size_t>(E));
      for (float& l : logits) l = pick(rng) == 0 ? 0.0f : (pick(rng) == 1 ? 200.0f : -200.0f);
      for (float& b : bias) b = static_cast<float>(bpick(rng)) * 0.25f;
      for (const RouterCase& c : router_cases(T, E, true)) {
        SCOPED_TRACE(testing::Message() << "E=" << E << " K=" << c.K << " bias=" << c.with_bias);
        const RouterOut fast = run_router(route_sigmoid_topk, logits, bias, c);
        const RouterOut ref = run_router(route_sigmoid_topk_ref, logits, bias, c);
        EXPECT_EQ(fast.ids, ref.ids);
        expect_bitwise(fast.w, ref.w);
      }
    }
  });
}

// Random logits: the scores (<= 1, where an ulp is <= 2^-24) differ from libm's by <= 4 ulps
// (see the gated norm), the biased scores by that plus one rounding of the add (< 2^-23 for
// |s + bias| < 2): < 2^-21 absolute. So the ids agree wherever the twin's sorted biased scores
// around the selection are more than 1e-6 apart; nearly tied tokens are skipped and must be
// rare. Weights: each of the K combined scores is off by < 2^-21 and the sum by < K 2^-21 plus
// K roundings; divided by the sum and scaled, (K + 8) 2^-21 relative to the largest weight
// (at least 1) bounds the difference.
TEST(RouterKernelFast, MatchesTwinOnRandomLogits) {
  for_each_target([] {
    for (int64_t E : {17, 128, 384, 896}) {
      const int64_t T = 24;
      std::vector<float> logits = randn(T * E, static_cast<uint32_t>(E), 2.5f);
      std::vector<float> bias = randn(E, static_cast<uint32_t>(E + 1), 0.05f);
      for (const RouterCase& c : router_cases(T, E, false)) {
        SCOPED_TRACE(testing::Message() << "E=" << E << " K=" << c.K << " bias=" << c.with_bias);
        const RouterOut fast = run_router(route_sigmoid_topk, logits, bias, c);
        const RouterOut ref = run_router(route_sigmoid_topk_ref, logits, bias, c);
        int64_t skipped = 0;
        for (int64_t t = 0; t < T; ++t) {
          std::vector<float> s(static_cast<size_t>(E));
          for (int64_t e = 0; e < E; ++e)
            s[static_cast<size_t>(e)] = sigmoidf(logits[static_cast<size_t>(t * E + e)]) +
                                        (c.with_bias ? bias[static_cast<size_t>(e)] : 0.0f);
          std::sort(s.begin(), s.end(), std::greater<>());
          bool near_tie = false;
          for (int64_t k = 0; k < std::min(c.K, E - 1); ++k)
            near_tie |= s[static_cast<size_t>(k)] - s[static_cast<size_t>(k + 1)] <= 1e-6f;
          if (near_tie) {
            ++skipped;
            continue;
          }
          float wmax = 1.0f;
          for (int64_t k = 0; k < c.K; ++k)
            wmax = std::max(wmax, std::fabs(ref.w[static_cast<size_t>(t * c.K + k)]));
          const float tol = static_cast<float>(c.K + 8) * std::ldexp(1.0f, -21) * wmax;
          for (int64_t k = 0; k < c.K; ++k) {
            const size_t i = static_cast<size_t>(t * c.K + k);
            ASSERT_EQ(fast.ids[i], ref.ids[i]) << "t=" << t << " k=" << k;
            ASSERT_LE(std::fabs(fast.w[i] - ref.w[i]), tol) << fast.w[i] << " vs " << ref.w[i];
          }
        }
        EXPECT_LE(skipped, T / 4);
      }
    }
  });
}

TEST(RouterKernelFast, ThreadCountInvariant) {
  const int64_t T = 200, E = 384, K = 8;
  static_assert(200 * 384 * 8 > kParallelMinWork);
  std::vector<float> logits = randn(T * E, 11, 2.0f), bias = randn(E, 12, 0.05f);
  RouterCase c{T, E, K, true, {}};
  c.opt.top_k = K;
  RouterOut one, two;
  with_threads(1, [&] { one = run_router(route_sigmoid_topk, logits, bias, c); });
  with_threads(2, [&] { two = run_router(route_sigmoid_topk, logits, bias, c); });
  EXPECT_EQ(one.ids, two.ids);
  expect_bitwise(one.w, two.w);
}

// --- KDA short convolution and gate --------------------------------------------------------

// SiLU: x / (1 + e) with e = Exp(-x) vs expf(-x) (<= 2 ulps apart; 1 + e shrinks that and adds
// a rounding, the divide another): <= 4 ulps. The convolution's pre-activation is bitwise the
// twin's (same products and sums, unfused), so the conv output is within SiLU's bound.
constexpr int64_t kSiluUlps = 4;

TEST(ConvGateFast, ConvMatchesTwin) {
  for_each_target([] {
    for (int64_t C : kLengths) {
      for (int W : {1, 2, 3, 4, 5}) {
        for (int64_t T : {1, 5, 33}) {
          if (C == 7168 && (W != 4 || T == 33)) continue;  // keeps the ASan run short
          SCOPED_TRACE(testing::Message() << "C=" << C << " W=" << W << " T=" << T);
          std::vector<float> x = randn(T * C, static_cast<uint32_t>(C + W), 2.0f);
          std::vector<float> w = randn(C * W, static_cast<uint32_t>(C + 100), 0.7f);
          std::vector<float> st0 = randn(C * (W - 1), static_cast<uint32_t>(C + 200));
          std::vector<float> st = st0, st_ref = st0, y(x.size()), ref(x.size());
          causal_conv1d_silu(x.data(), T, C, w.data(), W, st.data(), y.data());
          causal_conv1d_silu_ref(x.data(), T, C, w.data(), W, st_ref.data(), ref.data());
          expect_ulps(y, ref, kSiluUlps);
          expect_bitwise(st, st_ref);  // the carried inputs, copied
          // In place, split 1 + (T - 1): the same bits and state.
          std::vector<float> xa = x;
          st = st0;
          causal_conv1d_silu(xa.data(), 1, C, w.data(), W, st.data(), xa.data());
          causal_conv1d_silu(xa.data() + C, T - 1, C, w.data(), W, st.data(), xa.data() + C);
          expect_bitwise(xa, y);
          expect_bitwise(st, st_ref);
        }
      }
    }
  });
}

// Saturated pre-activations: SiLU of +-100, -88.5 (normal result in libm), -95 (expf
// overflows: -0), -1e30 (beyond Exp's range: -0).
TEST(ConvGateFast, ConvSaturatedValues) {
  const std::vector<float> x = {100.0f, -100.0f, -88.5f, -95.0f, -1e30f, 1e30f, 0.0f, -0.0f, 3.0f};
  const int64_t C = static_cast<int64_t>(x.size());
  const std::vector<float> w(static_cast<size_t>(C), 1.0f);
  for_each_target([&] {
    std::vector<float> st, st_ref, y(x.size()), ref(x.size());
    causal_conv1d_silu(x.data(), 1, C, w.data(), 1, st.data(), y.data());
    causal_conv1d_silu_ref(x.data(), 1, C, w.data(), 1, st_ref.data(), ref.data());
    expect_ulps(y, ref, kSiluUlps);
    EXPECT_EQ(y[4], 0.0f);
    EXPECT_EQ(y[5], 1e30f);
  });
}

// Gate: lower-bound form lb * sigmoid(a z): the sigmoid's 4 ulps and one product rounding.
// Softplus form -a * log1p(exp(z)): Exp vs expf <= 2 ulps, which log1p does not amplify
// (d log1p(e) / log1p(e) <= de / e), Log1p vs log1pf <= 3 ulps, one product rounding: <= 6.
TEST(ConvGateFast, GateMatchesTwin) {
  for_each_target([] {
    for (int64_t dk : kLengths) {
      if (dk == 7168) continue;
      const int64_t T = 3, H = 2;
      std::vector<float> f = randn(T * H * dk, static_cast<uint32_t>(dk), 3.0f);
      const float wide[] = {19.9f, 20.0f, 20.1f, 50.0f, -50.0f, -90.0f, -120.0f, 1e4f, -1e4f};
      for (size_t i = 0; i < f.size(); i += 4) f[i] = wide[(i / 4) % 9];
      std::vector<float> dt = randn(H * dk, static_cast<uint32_t>(dk + 1), 0.5f);
      std::vector<float> a_log = {0.7f, -1.5f};
      for (std::optional<float> lb : {std::optional<float>(-5.0f), std::optional<float>()}) {
        SCOPED_TRACE(testing::Message() << "dk=" << dk << " lb=" << lb.has_value());
        std::vector<float> g(f.size()), ref(f.size());
        kda_gate(f.data(), T, H, dk, a_log.data(), dt.data(), lb, g.data());
        kda_gate_ref(f.data(), T, H, dk, a_log.data(), dt.data(), lb, ref.data());
        expect_ulps(g, ref, lb ? 5 : 6);
        std::vector<float> inplace = f;
        kda_gate(inplace.data(), T, H, dk, a_log.data(), dt.data(), lb, inplace.data());
        expect_bitwise(inplace, g);
      }
    }
  });
}

TEST(ConvGateFast, ThreadCountInvariant) {
  const int64_t T = 80, C = 3000, H = 8, dk = 128;
  static_assert(80 * 3000 * 4 > kParallelMinWork && 80 * 8 * 128 > kParallelMinWork);
  const int W = 4;
  std::vector<float> x = randn(T * C, 21, 2.0f), w = randn(C * W, 22, 0.7f);
  std::vector<float> f = randn(T * H * dk, 23, 3.0f), dt = randn(H * dk, 24, 0.5f);
  std::vector<float> a_log = randn(H, 25, 0.5f);
  std::vector<float> y[2], st[2], g[2];
  for (int k = 0; k < 2; ++k) {
    with_threads(k + 1, [&] {
      y[k].assign(x.size(), 0.0f);
      st[k].assign(static_cast<size_t>(C * (W - 1)), 0.0f);
      g[k].assign(f.size(), 0.0f);
      causal_conv1d_silu(x.data(), T, C, w.data(), W, st[k].data(), y[k].data());
      kda_gate(f.data(), T, H, dk, a_log.data(), dt.data(), -5.0f, g[k].data());
    });
  }
  expect_bitwise(y[1], y[0]);
  expect_bitwise(st[1], st[0]);
  expect_bitwise(g[1], g[0]);
}

// --- silu_mul ------------------------------------------------------------------------------

TEST(SiluMulFast, MatchesTwin) {
  for_each_target([] {
    for (int64_t n : kLengths) {
      std::vector<float> g = randn(n, static_cast<uint32_t>(n), 3.0f);
      std::vector<float> u = randn(n, static_cast<uint32_t>(n + 1), 2.0f);
      const float wide[] = {88.0f, -88.0f, -88.5f, -89.0f, -103.0f, -105.0f, -1e30f, 1e30f, 0.0f};
      for (size_t i = 0; i < g.size(); i += 3) g[i] = wide[(i / 3) % 9];
      SCOPED_TRACE(testing::Message() << "n=" << n);
      std::vector<float> y(g.size()), ref(g.size()), yb(g.size()), refb(g.size());
      silu_mul(g.data(), u.data(), n, false, y.data());
      silu_mul_ref(g.data(), u.data(), n, false, ref.data());
      expect_ulps(y, ref, kSiluUlps + 1);  // the SiLU's 4 ulps and the product's rounding
      // bf16 output: the same f32 products rounded in the vector exactly as round_bf16.
      silu_mul(g.data(), u.data(), n, true, yb.data());
      silu_mul_ref(g.data(), u.data(), n, true, refb.data());
      for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(yb[i], round_bf16(y[i])) << i;
      expect_ulps(yb, refb, kBf16Ulp);
      // Stored as bf16: those values' bits, and the twin's likewise.
      std::vector<bf16> h(g.size()), refh(g.size());
      silu_mul(g.data(), u.data(), n, h.data());
      silu_mul_ref(g.data(), u.data(), n, refh.data());
      for (size_t i = 0; i < y.size(); ++i) {
        ASSERT_EQ(h[i].bits, f32_to_bf16(yb[i]).bits) << i;
        ASSERT_EQ(refh[i].bits, f32_to_bf16(refb[i]).bits) << i;
      }
      std::vector<float> over_gate = g, over_up = u;
      silu_mul(over_gate.data(), u.data(), n, false, over_gate.data());
      silu_mul(g.data(), over_up.data(), n, false, over_up.data());
      expect_bitwise(over_gate, y);
      expect_bitwise(over_up, y);
    }
  });
}

// An element's value depends only on its pair: 1 and 2 threads, and other offsets (other
// lanes, the padded ragged end) give the same bits.
TEST(SiluMulFast, PositionAndThreadCountInvariant) {
  const int64_t n = 70001;  // above kParallelMinWork, not a multiple of any width
  std::vector<float> g = randn(n, 31, 3.0f), u = randn(n, 32);
  std::vector<float> one(g.size()), two(g.size());
  with_threads(1, [&] { silu_mul(g.data(), u.data(), n, false, one.data()); });
  with_threads(2, [&] { silu_mul(g.data(), u.data(), n, false, two.data()); });
  expect_bitwise(two, one);
  for (int64_t off : {1, 5, 13}) {
    std::vector<float> y(37);
    silu_mul(g.data() + off, u.data() + off, 37, false, y.data());
    expect_bitwise(y, std::vector<float>(one.begin() + off, one.begin() + off + 37));
  }
}

// --- MoE combine -------------------------------------------------------------------------

// Bitwise the twin on every target: the same product-then-sum per term in slot order. Random
// weights and rows make about half of all fused multiply-adds round differently from a product
// and a sum, so a contracted build fails here. Rows repeat (a token may meet one expert output
// row only once in the engine, but the kernel does not rely on it); widths on and off every
// vector multiple; slots 1 (decode's shortest) to 9.
TEST(MoeCombineFast, MatchesTwinBitwise) {
  std::mt19937 rng(71);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  for (int64_t n : {1, 3, 15, 16, 17, 33, 63, 64, 65, 100, 512, 515}) {
    for (int64_t k : {1, 2, 8, 9}) {
      const int64_t nrows = 12, ldx = n + 5;
      std::vector<float> x(static_cast<size_t>(nrows * ldx));
      for (float& v : x)
        v = nd(rng) * std::exp2(static_cast<float>(static_cast<int>(rng() % 20) - 10));
      std::vector<int64_t> rows(static_cast<size_t>(k));
      std::vector<float> w(static_cast<size_t>(k));
      for (int64_t s = 0; s < k; ++s) {
        rows[static_cast<size_t>(s)] = static_cast<int64_t>(rng() % nrows);
        w[static_cast<size_t>(s)] = ud(rng);
      }
      std::vector<float> y0(static_cast<size_t>(n));
      for (float& v : y0) v = nd(rng);
      std::vector<float> want = y0;
      moe_combine_ref(x.data(), ldx, rows.data(), w.data(), k, n, want.data());
      for_each_target([&] {
        SCOPED_TRACE(testing::Message() << "n=" << n << " k=" << k);
        std::vector<float> got = y0;
        moe_combine(x.data(), ldx, rows.data(), w.data(), k, n, got.data());
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(i)]),
                    std::bit_cast<uint32_t>(want[static_cast<size_t>(i)]))
              << "element " << i;
      });
    }
  }
}

}  // namespace
}  // namespace attnres
