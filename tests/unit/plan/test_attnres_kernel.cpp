// The AttnRes step (kernels/attnres.h): fused kernel against the scalar reference, the read's
// formula on hand-computed values, aliasing, thread-count invariance, and the hardware bf16
// casts (AVX512_BF16) bitwise equal to the software cast on denormal, infinite and NaN values.
#include <gtest/gtest.h>
#include "util/parallel.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/attnres.h"

namespace attnres {
namespace {

template <typename T>
T from_f(float x) {
  if constexpr (std::is_same_v<T, bf16>) {
    return f32_to_bf16(x);
  } else {
    return x;
  }
}
template <typename T>
float to_f(T x) {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16_to_f32(x);
  } else {
    return x;
  }
}
template <typename T>
uint32_t bits(T x) {
  if constexpr (std::is_same_v<T, bf16>) {
    return x.bits;
  } else {
    return std::bit_cast<uint32_t>(x);
  }
}

// Distance in units in the last place of T between two finite values of the same sign class
// (ordered-integer difference of their bit patterns).
template <typename T>
int64_t ulp_distance(T a, T b) {
  auto ord = [](T x) -> int64_t {
    if constexpr (std::is_same_v<T, bf16>) {
      const int32_t v = x.bits;
      return (v & 0x8000) ? -static_cast<int64_t>(v & 0x7fff) : v;
    } else {
      const int64_t v = std::bit_cast<uint32_t>(x);
      return (v & 0x80000000u) ? -(v & 0x7fffffff) : v;
    }
  };
  return std::llabs(ord(a) - ord(b));
}

// A random step problem: S slots, running sum, pending; buffers [T, d].
template <typename T>
struct Problem {
  int64_t tokens, dim;
  int slots;
  std::vector<std::vector<T>> bank;
  std::vector<std::vector<float>> bank_inv;  // computed by a reference commit
  std::vector<T> rs_in, pending;
  std::vector<float> query, gain;

  Problem(int64_t t, int64_t d, int s, uint32_t seed) : tokens(t), dim(d), slots(s) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    std::uniform_real_distribution<float> g(0.5f, 1.5f);
    auto fill = [&](std::vector<T>& v, float scale) {
      v.resize(static_cast<size_t>(t * d));
      for (T& x : v) x = from_f<T>(scale * n01(rng));
    };
    bank.resize(static_cast<size_t>(s));
    bank_inv.resize(static_cast<size_t>(s));
    for (int k = 0; k < s; ++k) {
      fill(bank[k], 0.5f + static_cast<float>(k));
      bank_inv[k].resize(static_cast<size_t>(t));
      for (int64_t r = 0; r < t; ++r) {
        float ss = 0;
        for (int64_t j = 0; j < d; ++j) {
          const float x = to_f(bank[k][static_cast<size_t>(r * d + j)]);
          ss += x * x;
        }
        bank_inv[k][static_cast<size_t>(r)] = attnres_inv_rms(ss, d, 1e-5f);
      }
    }
    fill(rs_in, 2.0f);
    fill(pending, 1.0f);
    const float qs = 4.0f / std::sqrt(static_cast<float>(d));
    query.resize(static_cast<size_t>(d));
    for (float& x : query) x = qs * n01(rng);
    gain.resize(static_cast<size_t>(d));
    for (float& x : gain) x = round_bf16(g(rng));
  }
};

// Output buffers of one step.
template <typename T>
struct Outputs {
  std::vector<T> rs_out, commit, out, raw;
  std::vector<float> commit_inv;
};

enum class Mode { kAdd, kRestart, kNoPending };

template <typename T>
Outputs<T> run(const Problem<T>& p, Mode mode, bool commit, bool fused, float norm_eps = 1e-5f) {
  const size_t n = static_cast<size_t>(p.tokens * p.dim);
  Outputs<T> o;
  o.rs_out.assign(n, T{});
  o.commit.assign(n, T{});
  o.out.assign(n, T{});
  o.raw.assign(n, T{});
  o.commit_inv.assign(static_cast<size_t>(p.tokens), 0.0f);
  std::vector<const T*> slots;
  std::vector<const float*> inv;
  for (int k = 0; k < p.slots; ++k) {
    slots.push_back(p.bank[k].data());
    inv.push_back(p.bank_inv[k].data());
  }
  AttnResStepArgs<T> a;
  a.tokens = p.tokens;
  a.dim = p.dim;
  a.res_eps = 1e-5f;
  a.norm_eps = norm_eps;
  a.num_slots = p.slots;
  a.slots = slots.data();
  a.slot_inv_rms = inv.data();
  a.rs_in = mode == Mode::kRestart ? nullptr : p.rs_in.data();
  a.pending = mode == Mode::kNoPending ? nullptr : p.pending.data();
  a.rs_out = mode == Mode::kAdd ? o.rs_out.data() : nullptr;
  a.commit = commit ? o.commit.data() : nullptr;
  a.commit_inv_rms = commit ? o.commit_inv.data() : nullptr;
  a.query = p.query.data();
  a.norm_weight = p.gain.data();
  a.out = o.out.data();
  a.raw_mixture = o.raw.data();
  if (fused) {
    attnres_step(a);
  } else {
    attnres_step_ref(a);
  }
  return o;
}

// ulp of T at |x| (the spacing of T's values there).
template <typename T>
double ulp_at(double x) {
  const int mant = std::is_same_v<T, bf16> ? 8 : 24;
  int e;
  std::frexp(std::max(std::fabs(x), 1e-30), &e);
  return std::ldexp(1.0, e - mant);
}

// Worst (|f - r| - ulps x ulp_T(r)) / rms(r row): the error beyond `ulps` roundings of the
// result, relative to the row's scale.
template <typename T>
double excess_error(const std::vector<T>& f, const std::vector<T>& r, int64_t d, double ulps) {
  double worst = 0;
  for (size_t row = 0; row * static_cast<size_t>(d) < r.size(); ++row) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double x = to_f(r[row * static_cast<size_t>(d) + static_cast<size_t>(j)]);
      ss += x * x;
    }
    const double rms = std::sqrt(ss / static_cast<double>(d)) + 1e-30;
    for (int64_t j = 0; j < d; ++j) {
      const size_t i = row * static_cast<size_t>(d) + static_cast<size_t>(j);
      const double a = to_f(f[i]), b = to_f(r[i]);
      worst = std::max(worst, (std::fabs(a - b) - ulps * ulp_at<T>(b)) / rms);
    }
  }
  return worst;
}

// The documented bound (attnres.h): running sum and commit bitwise equal; every element of the
// mixture within 1 ulp of T, and of the normalised output within 3 ulp of T (the mixture's ulp
// and the norm's two casts), plus kScoreTolerance x the row's RMS (score differences of a few
// fp32 ulp moving the softmax weights); the commit's inverse RMS within a relative 1e-5 (the
// fp32 sum of squares in another order).
constexpr double kScoreTolerance = 1e-4;

template <typename T>
double expect_within_bound(const Outputs<T>& f, const Outputs<T>& r, int64_t d,
                           const std::string& what) {
  size_t rs_diff = 0, commit_diff = 0;
  for (size_t i = 0; i < f.out.size(); ++i) {
    rs_diff += bits(f.rs_out[i]) != bits(r.rs_out[i]);
    commit_diff += bits(f.commit[i]) != bits(r.commit[i]);
  }
  EXPECT_EQ(rs_diff, 0u) << what;
  EXPECT_EQ(commit_diff, 0u) << what;
  for (size_t t = 0; t < f.commit_inv.size(); ++t) {
    EXPECT_NEAR(f.commit_inv[t], r.commit_inv[t], 1e-5 * std::fabs(r.commit_inv[t]))
        << what << " inv_rms " << t;
  }
  const double e_out = excess_error(f.out, r.out, d, 3.0);
  const double e_raw = excess_error(f.raw, r.raw, d, 1.0);
  EXPECT_LE(e_out, kScoreTolerance) << what;
  EXPECT_LE(e_raw, kScoreTolerance) << what;
  return std::max(e_out, e_raw);
}

template <typename T>
void fused_matches_reference() {
  // d not a multiple of any vector width: exercises the tails.
  double worst = 0;
  for (int slots = 0; slots <= 8; ++slots) {
    const Problem<T> p(19, 517, slots, 100u + static_cast<uint32_t>(slots));
    for (Mode mode : {Mode::kAdd, Mode::kRestart, Mode::kNoPending}) {
      for (bool commit : {false, true}) {
        const std::string what = "S=" + std::to_string(slots + 1) + " mode " +
                                 std::to_string(static_cast<int>(mode)) + " commit " +
                                 std::to_string(commit);
        worst = std::max(worst, expect_within_bound(run(p, mode, commit, true),
                                                    run(p, mode, commit, false), p.dim, what));
      }
    }
  }
  std::printf("  worst excess error / row RMS: %.3g (bound %.3g)\n", worst, kScoreTolerance);
}

TEST(AttnResKernel, FusedMatchesReferenceBf16) {
  fused_matches_reference<bf16>();
}
TEST(AttnResKernel, FusedMatchesReferenceF32) {
  fused_matches_reference<float>();
}

// The read formula on values small enough to compute by hand.
TEST(AttnResKernel, ReadFormulaByHand) {
  // d = 2, two sources; q = [1, 0]; eps = 0.
  const float v0[2] = {1.0f, 1.0f};  // rms 1, dot 1 -> score 1
  const float v1[2] = {3.0f, 4.0f};  // mean sq 12.5 -> rsqrt; dot 3 -> score 3/sqrt(12.5)
  const float q[2] = {1.0f, 0.0f};
  const float* src[2] = {v0, v1};
  float out[2];
  attnres_read_ref(src, 2, 1, 2, q, 0.0f, out);
  const double s0 = 1.0, s1 = 3.0 / std::sqrt(12.5);
  const double p1 = std::exp(s1) / (std::exp(s0) + std::exp(s1));
  const double p0 = 1.0 - p1;
  EXPECT_NEAR(out[0], p0 * 1.0 + p1 * 3.0, 1e-6);
  EXPECT_NEAR(out[1], p0 * 1.0 + p1 * 4.0, 1e-6);
}

// One source: the read is the identity and the step is exactly RMSNorm (KimiRMSNorm order).
TEST(AttnResKernel, OneSourceIsTheNorm) {
  const Problem<bf16> p(5, 67, 0, 7);
  const Outputs<bf16> f = run(p, Mode::kNoPending, true, true);
  for (int64_t t = 0; t < p.tokens; ++t) {
    float ss = 0;
    for (int64_t j = 0; j < p.dim; ++j) {
      const float x = bf16_to_f32(p.rs_in[static_cast<size_t>(t * p.dim + j)]);
      ss += x * x;
    }
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(p.dim) + 1e-5f);
    for (int64_t j = 0; j < p.dim; ++j) {
      const size_t i = static_cast<size_t>(t * p.dim + j);
      EXPECT_EQ(f.raw[i].bits, p.rs_in[i].bits);  // mixture == source
      EXPECT_EQ(f.commit[i].bits, p.rs_in[i].bits);
      const float y = round_bf16(round_bf16(bf16_to_f32(p.rs_in[i]) * inv) * p.gain[j]);
      EXPECT_LE(ulp_distance(f.out[i], f32_to_bf16(y)), 1);
    }
  }
}

// The running-sum add rounds exactly like f32_to_bf16, ties to even and non-finite included.
TEST(AttnResKernel, AddRoundsLikeScalarCast) {
  const float cases[][2] = {{1.0f, 0.00390625f},        // 1 + 2^-8: tie, stays 1
                            {1.0078125f, 0.00390625f},  // tie, rounds up to even
                            {-3.0f, -0.01171875f},     {65280.0f, 65280.0f},
                            {3.3e38f, 3.3e38f},      // overflows to inf
                            {INFINITY, -INFINITY}};  // NaN
  const int64_t d = 37;
  for (const auto& c : cases) {
    Problem<bf16> p(1, d, 0, 1);
    for (int64_t j = 0; j < d; ++j) {
      p.rs_in[static_cast<size_t>(j)] = f32_to_bf16(c[0]);
      p.pending[static_cast<size_t>(j)] = f32_to_bf16(c[1]);
    }
    const Outputs<bf16> f = run(p, Mode::kAdd, false, true);
    const bf16 expect =
        f32_to_bf16(bf16_to_f32(f32_to_bf16(c[0])) + bf16_to_f32(f32_to_bf16(c[1])));
    for (int64_t j = 0; j < d; ++j) EXPECT_EQ(f.rs_out[static_cast<size_t>(j)].bits, expect.bits);
  }
}

// Outputs may alias their inputs: out over pending, rs_out over rs_in, commit over rs_out.
TEST(AttnResKernel, AliasingGivesTheSameResult) {
  const Problem<bf16> p(23, 300, 4, 11);
  const Outputs<bf16> plain = run(p, Mode::kAdd, true, true);
  std::vector<bf16> rs = p.rs_in, pend = p.pending;
  std::vector<float> inv(static_cast<size_t>(p.tokens));
  std::vector<const bf16*> slots;
  std::vector<const float*> sinv;
  for (int k = 0; k < p.slots; ++k) {
    slots.push_back(p.bank[k].data());
    sinv.push_back(p.bank_inv[k].data());
  }
  AttnResStepArgs<bf16> a;
  a.tokens = p.tokens;
  a.dim = p.dim;
  a.res_eps = a.norm_eps = 1e-5f;
  a.num_slots = p.slots;
  a.slots = slots.data();
  a.slot_inv_rms = sinv.data();
  a.rs_in = rs.data();
  a.pending = pend.data();
  a.rs_out = rs.data();
  a.commit = rs.data();
  a.commit_inv_rms = inv.data();
  a.query = p.query.data();
  a.norm_weight = p.gain.data();
  a.out = pend.data();
  attnres_step(a);
  for (size_t i = 0; i < rs.size(); ++i) {
    ASSERT_EQ(rs[i].bits, plain.rs_out[i].bits) << i;
    ASSERT_EQ(pend[i].bits, plain.out[i].bits) << i;
  }
  EXPECT_EQ(inv, plain.commit_inv);
}

// Bitwise identical for 1 and 2 OpenMP threads (shape above the parallel threshold).
TEST(AttnResKernel, ThreadCountInvariant) {
  const int64_t T = 72, d = 3661;
  ASSERT_GE(T * d, kAttnResParallelMinElements);
  const Problem<bf16> p(T, d, 8, 3);
  const int saved = parallel_threads();
  set_parallel_threads(1);
  const Outputs<bf16> one = run(p, Mode::kAdd, true, true);
  set_parallel_threads(2);
  const Outputs<bf16> two = run(p, Mode::kAdd, true, true);
  set_parallel_threads(saved);
  for (size_t i = 0; i < one.out.size(); ++i) {
    ASSERT_EQ(one.out[i].bits, two.out[i].bits) << i;
    ASSERT_EQ(one.rs_out[i].bits, two.rs_out[i].bits) << i;
  }
  EXPECT_EQ(one.commit_inv, two.commit_inv);
}

// The hardware bf16 casts (AVX512_BF16 vcvtne2ps2bf16, used by the fused step where the CPU has
// them) flush denormal inputs to zero where the software cast rounds them: the kernel tests each
// converted pair and falls back. Rows built to give denormal, infinite and NaN values at the
// casts of pass 1 (the add), pass 3 (the mixture) and pass 4 (both casts of the norm: a norm eps
// of 1 lets x * inv itself be denormal; gains of 2^-130 and 1e38 make the second cast denormal
// or overflow) must give bitwise the same outputs with and without the instruction.
template <typename T>
size_t count_denormal(const std::vector<T>& v) {
  size_t n = 0;
  for (const T& x : v) n += (x.bits & 0x7f80) == 0 && (x.bits & 0x7f) != 0;
  return n;
}

template <typename T>
size_t count_nonfinite(const std::vector<T>& v) {
  size_t n = 0;
  for (const T& x : v) n += (x.bits & 0x7f80) == 0x7f80;
  return n;
}

// Row r of a problem becomes special: scaled into (or below) the bf16 denormal range, a NaN in
// one source, or values near the bf16 maximum (the add overflows, the mixture nears it).
void make_special_rows(Problem<bf16>& p) {
  const auto d = static_cast<size_t>(p.dim);
  auto rows_of = [&](size_t r, auto&& f) {
    auto apply = [&](std::vector<bf16>& v) {
      for (size_t j = 0; j < d; ++j) v[r * d + j] = f32_to_bf16(f(bf16_to_f32(v[r * d + j]), j));
    };
    for (auto& b : p.bank) apply(b);
    apply(p.rs_in);
    apply(p.pending);
  };
  for (size_t r = 0; r < static_cast<size_t>(p.tokens); ++r) {
    switch (r % 6) {
      case 0:  // unchanged
        break;
      case 1:  // mostly normal, sums and mixtures cross 2^-126
        rows_of(r, [](float x, size_t) { return std::ldexp(x, -125); });
        break;
      case 2:  // bf16 denormals throughout
        rows_of(r, [](float x, size_t) { return std::ldexp(x, -129); });
        break;
      case 3:  // near the bf16 maximum: the add overflows to inf, inf - inf gives NaN
        rows_of(r, [](float x, size_t) { return std::ldexp(x, 126); });
        break;
      case 4:  // a NaN at column 5 of every source (the row's scores and mixture turn NaN)
        rows_of(r, [](float x, size_t j) { return j == 5 ? NAN : x; });
        break;
      default:  // a mix of scales column by column
        rows_of(r, [](float x, size_t j) { return std::ldexp(x, j % 3 == 0 ? -128 : -100); });
        break;
    }
  }
}

TEST(AttnResKernel, HardwareCastsAreBitwiseTheSoftwareCast) {
  const bool hw = attnres_set_hw_bf16_casts(true);
  std::printf("  hardware bf16 casts %s (target %s)\n", hw ? "used" : "not available",
              attnres_target_name().c_str());
  size_t denormal_rs = 0, denormal_raw = 0, denormal_out = 0, nonfinite = 0;
  // Not and a multiple of 32 columns; above 8192 the kernel gathers the gain per row.
  for (int64_t d : {int64_t{517}, int64_t{1024}, int64_t{8224}}) {
    for (int slots = 0; slots <= 8; ++slots) {
      if (d > 8192 && slots % 4 != 0) continue;  // keep the test light
      for (bool special_gain : {false, true}) {
        Problem<bf16> p(12, d, slots, 500u + static_cast<uint32_t>(slots));
        make_special_rows(p);
        if (special_gain) {
          for (size_t j = 0; j < p.gain.size(); ++j) {
            if (j % 5 == 1) p.gain[j] = std::ldexp(1.0f, -130);
            if (j % 5 == 3) p.gain[j] = 1e38f;
          }
        }
        for (float norm_eps : {1e-5f, 1.0f}) {
          for (Mode mode : {Mode::kAdd, Mode::kNoPending}) {
            const std::string what = "d=" + std::to_string(d) + " S=" + std::to_string(slots + 1) +
                                     " gain " + std::to_string(special_gain) + " eps " +
                                     std::to_string(norm_eps) + " mode " +
                                     std::to_string(static_cast<int>(mode));
            attnres_set_hw_bf16_casts(true);
            const Outputs<bf16> h = run(p, mode, true, true, norm_eps);
            attnres_set_hw_bf16_casts(false);
            const Outputs<bf16> s = run(p, mode, true, true, norm_eps);
            attnres_set_hw_bf16_casts(true);
            size_t diff = 0;
            for (size_t i = 0; i < h.out.size(); ++i) {
              diff += h.rs_out[i].bits != s.rs_out[i].bits;
              diff += h.commit[i].bits != s.commit[i].bits;
              diff += h.out[i].bits != s.out[i].bits;
              diff += h.raw[i].bits != s.raw[i].bits;
            }
            EXPECT_EQ(diff, 0u) << what;
            for (size_t t = 0; t < h.commit_inv.size(); ++t) {
              EXPECT_EQ(std::bit_cast<uint32_t>(h.commit_inv[t]),
                        std::bit_cast<uint32_t>(s.commit_inv[t]))
                  << what << " inv_rms " << t;
            }
            if (mode == Mode::kAdd) {  // the add against the scalar twin, bitwise
              const Outputs<bf16> r = run(p, mode, true, false, norm_eps);
              size_t rs_diff = 0;
              for (size_t i = 0; i < h.rs_out.size(); ++i) {
                rs_diff += h.rs_out[i].bits != r.rs_out[i].bits;
                rs_diff += h.commit[i].bits != r.commit[i].bits;
              }
              EXPECT_EQ(rs_diff, 0u) << what;
              denormal_rs += count_denormal(h.rs_out);
            }
            denormal_raw += count_denormal(h.raw);
            denormal_out += count_denormal(h.out);
            nonfinite += count_nonfinite(h.rs_out) + count_nonfinite(h.out);
          }
        }
      }
    }
  }
  // The inputs did reach the casts with denormal and non-finite values (a denormal bf16 result
  // comes only from a denormal f32 input, which the instruction would have flushed to zero).
  EXPECT_GT(denormal_rs, 0u);
  EXPECT_GT(denormal_raw, 0u);
  EXPECT_GT(denormal_out, 0u);
  EXPECT_GT(nonfinite, 0u);
  std::printf("  denormal results: add %zu, mixture %zu, norm %zu; non-finite %zu\n", denormal_rs,
              denormal_raw, denormal_out, nonfinite);
}

// The hardware-cast path with special rows: bitwise the same for 1 and 2 OpenMP threads and
// the same as without the instruction (a shape above the parallel threshold).
TEST(AttnResKernel, HardwareCastsThreadCountInvariant) {
  const int64_t T = 72, d = 3661;
  ASSERT_GE(T * d, kAttnResParallelMinElements);
  Problem<bf16> p(T, d, 8, 9);
  make_special_rows(p);
  const int saved = parallel_threads();
  attnres_set_hw_bf16_casts(true);
  set_parallel_threads(1);
  const Outputs<bf16> one = run(p, Mode::kAdd, true, true, 1.0f);
  set_parallel_threads(2);
  const Outputs<bf16> two = run(p, Mode::kAdd, true, true, 1.0f);
  attnres_set_hw_bf16_casts(false);
  const Outputs<bf16> soft = run(p, Mode::kAdd, true, true, 1.0f);
  attnres_set_hw_bf16_casts(true);
  set_parallel_threads(saved);
  for (size_t i = 0; i < one.out.size(); ++i) {
    ASSERT_EQ(one.out[i].bits, two.out[i].bits) << i;
    ASSERT_EQ(one.raw[i].bits, two.raw[i].bits) << i;
    ASSERT_EQ(one.rs_out[i].bits, two.rs_out[i].bits) << i;
    ASSERT_EQ(one.out[i].bits, soft.out[i].bits) << i;
    ASSERT_EQ(one.raw[i].bits, soft.raw[i].bits) << i;
    ASSERT_EQ(one.rs_out[i].bits, soft.rs_out[i].bits) << i;
  }
  for (size_t t = 0; t < one.commit_inv.size(); ++t) {
    EXPECT_EQ(std::bit_cast<uint32_t>(one.commit_inv[t]),
              std::bit_cast<uint32_t>(two.commit_inv[t]));
    EXPECT_EQ(std::bit_cast<uint32_t>(one.commit_inv[t]),
              std::bit_cast<uint32_t>(soft.commit_inv[t]));
  }
}

}  // namespace
}  // namespace attnres
