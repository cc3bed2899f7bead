// Kernel tests for the model's numerics: the chunked KDA form against the recurrent definition,
// conv state carry, MLA absorbed against expanded attention, router selection and weights,
// SiTU values, and aliasing of norms.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/absorbed_weights.h"
#include "kernels/activation.h"
#include "kernels/kda.h"
#include "kernels/mla.h"
#include "kernels/norm.h"
#include "kernels/router.h"
#include "model/arena.h"
#include "model/kv_cache.h"
#include "model/state.h"

namespace attnres {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

TensorView f32_view(const std::vector<float>& v, std::vector<int64_t> shape) {
  TensorView t;
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  t.data = reinterpret_cast<const std::byte*>(v.data());
  t.nbytes = v.size() * sizeof(float);
  return t;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0.0f;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Random KDA inputs shaped like the model's: q, k L2-normalised (q scaled), g from the
// lower-bound gate (per-step decay in [exp(-5), 1]), beta in (0, 1).
struct KdaInputs {
  int64_t T, H, dk, dv;
  std::vector<float> q, k, v, g, beta;
  KdaInputs(int64_t T_, int64_t H_, int64_t dk_, int64_t dv_, uint32_t seed)
      : T(T_), H(H_), dk(dk_), dv(dv_) {
    q = randn(T * H * dk, seed);
    k = randn(T * H * dk, seed + 1);
    v = randn(T * H * dv, seed + 2);
    std::vector<float> f = randn(T * H * dk, seed + 3, 2.0f);
    std::vector<float> a_log = randn(H, seed + 4, 0.5f);
    std::vector<float> dt = randn(H * dk, seed + 5, 0.5f);
    l2_norm(q.data(), T * H, dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(dk)), q.data());
    l2_norm(k.data(), T * H, dk, 1e-6f, 1.0f, k.data());
    g.resize(f.size());
    kda_gate(f.data(), T, H, dk, a_log.data(), dt.data(), -5.0f, g.data());
    beta = randn(T * H, seed + 6);
    for (auto& b : beta) b = sigmoidf(b);
  }
};

TEST(KdaKernel, ChunkedMatchesRecurrentForSeveralChunkSizes) {
  KdaInputs in(37, 3, 16, 12, 11);
  std::vector<float> s0 = randn(in.H * in.dk * in.dv, 99, 0.3f);  // carried state
  std::vector<float> s_ref = s0, o_ref(in.T * in.H * in.dv);
  kda_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), in.T, in.H,
                in.dk, in.dv, s_ref.data(), o_ref.data());
  for (int64_t chunk : {1, 5, 8, 16, 64}) {
    std::vector<float> s = s0, o(o_ref.size());
    std::vector<float> scratch(kda_chunk_scratch_floats(in.H, chunk, in.dk, in.dv));
    kda_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), in.T, in.H,
                in.dk, in.dv, chunk, s.data(), o.data(), scratch.data());
    EXPECT_LT(max_abs_diff(o, o_ref), 2e-5f) << "chunk " << chunk;
    EXPECT_LT(max_abs_diff(s, s_ref), 2e-5f) << "chunk " << chunk;
  }
}

TEST(KdaKernel, ChunkedHandlesStrongDecayWithoutLowerBound) {
  // Softplus gate with large A_log: per-step log decays down to about -100, so sub-block decay
  // spans exceed what the factored form may use and the exact pairwise path must take over.
  KdaInputs in(70, 2, 8, 6, 81);
  std::vector<float> f = randn(in.T * in.H * in.dk, 82, 3.0f);
  std::vector<float> a_log = {3.0f, -2.0f};  // head 0 decays hard, head 1 gently
  std::vector<float> dt(in.H * in.dk, 0.0f);
  kda_gate(f.data(), in.T, in.H, in.dk, a_log.data(), dt.data(), std::nullopt, in.g.data());
  float min_g = 0.0f;
  for (float x : in.g) min_g = std::min(min_g, x);
  EXPECT_LT(min_g, -40.0f);
  std::vector<float> s_ref(in.H * in.dk * in.dv, 0.0f), o_ref(in.T * in.H * in.dv);
  kda_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), in.T, in.H,
                in.dk, in.dv, s_ref.data(), o_ref.data());
  for (int64_t chunk : {16, 64}) {
    std::vector<float> s(s_ref.size(), 0.0f), o(o_ref.size());
    std::vector<float> scratch(kda_chunk_scratch_floats(in.H, chunk, in.dk, in.dv));
    kda_chunked(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), in.T, in.H,
                in.dk, in.dv, chunk, s.data(), o.data(), scratch.data());
    for (float x : o) ASSERT_TRUE(std::isfinite(x));
    EXPECT_LT(max_abs_diff(o, o_ref), 2e-5f) << "chunk " << chunk;
    EXPECT_LT(max_abs_diff(s, s_ref), 2e-5f) << "chunk " << chunk;
  }
}

TEST(KdaKernel, SplitSequenceCarriesState) {
  KdaInputs in(20, 2, 8, 8, 21);
  std::vector<float> s_full(in.H * in.dk * in.dv, 0.0f), o_full(in.T * in.H * in.dv);
  kda_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), in.T, in.H,
                in.dk, in.dv, s_full.data(), o_full.data());
  // Token by token: bitwise the same recurrence.
  std::vector<float> s(s_full.size(), 0.0f), o(o_full.size());
  for (int64_t t = 0; t < in.T; ++t) {
    kda_recurrent(in.q.data() + t * in.H * in.dk, in.k.data() + t * in.H * in.dk,
                  in.v.data() + t * in.H * in.dv, in.g.data() + t * in.H * in.dk,
                  in.beta.data() + t * in.H, 1, in.H, in.dk, in.dv, s.data(),
                  o.data() + t * in.H * in.dv);
  }
  EXPECT_EQ(o, o_full);
  EXPECT_EQ(s, s_full);
}

TEST(KdaKernel, DecayOnlyWhenBetaIsZero) {
  // beta = 0: the state only decays, S_T = diag(prod alpha) S_0, and o_t = S_t^T q_t.
  KdaInputs in(4, 1, 4, 3, 31);
  for (auto& b : in.beta) b = 0.0f;
  std::vector<float> s0 = randn(in.dk * in.dv, 5), s = s0, o(in.T * in.dv);
  kda_recurrent(in.q.data(), in.k.data(), in.v.data(), in.g.data(), in.beta.data(), in.T, 1, in.dk,
                in.dv, s.data(), o.data());
  for (int64_t i = 0; i < in.dk; ++i) {
    float decay = 1.0f;
    for (int64_t t = 0; t < in.T; ++t) decay *= std::exp(in.g[t * in.dk + i]);
    for (int64_t j = 0; j < in.dv; ++j)
      EXPECT_NEAR(s[i * in.dv + j], s0[i * in.dv + j] * decay, 1e-6f);
  }
}

TEST(KdaKernel, GateFormsAndPerHeadALog) {
  const int64_t H = 2, dk = 3;
  std::vector<float> f = {0.1f, -0.2f, 0.3f, 1.0f, 2.0f, -1.0f};
  std::vector<float> a_log = {0.5f, -1.0f};
  std::vector<float> dt = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  std::vector<float> g(6), gs(6);
  kda_gate(f.data(), 1, H, dk, a_log.data(), dt.data(), -5.0f, g.data());
  kda_gate(f.data(), 1, H, dk, a_log.data(), dt.data(), std::nullopt, gs.data());
  for (int64_t c = 0; c < 6; ++c) {
    const float a = std::exp(a_log[c / dk]);  // per head, not per channel
    const float z = f[c] + dt[c];
    EXPECT_FLOAT_EQ(g[c], -5.0f / (1.0f + std::exp(-a * z)));
    EXPECT_FLOAT_EQ(gs[c], -a * std::log1p(std::exp(z)));
  }
}

TEST(ConvKernel, StateCarryAndAliasing) {
  const int64_t T = 9, C = 5;
  const int W = 4;
  std::vector<float> x = randn(T * C, 41), w = randn(C * W, 42);
  std::vector<float> st_full(C * (W - 1), 0.0f), y_full(T * C);
  causal_conv1d_silu(x.data(), T, C, w.data(), W, st_full.data(), y_full.data());
  // Reference: explicit zero-padded convolution.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int j = 0; j < W; ++j) {
        const int64_t src = t - (W - 1) + j;
        if (src >= 0) acc += w[c * W + j] * x[src * C + c];
      }
      EXPECT_FLOAT_EQ(y_full[t * C + c], siluf(acc));
    }
  // Split 2 + 1 + 6 in place (y aliases x): same values, same final state.
  std::vector<float> xa = x, st(C * (W - 1), 0.0f);
  causal_conv1d_silu(xa.data(), 2, C, w.data(), W, st.data(), xa.data());
  causal_conv1d_silu(xa.data() + 2 * C, 1, C, w.data(), W, st.data(), xa.data() + 2 * C);
  causal_conv1d_silu(xa.data() + 3 * C, 6, C, w.data(), W, st.data(), xa.data() + 3 * C);
  EXPECT_EQ(xa, y_full);
  EXPECT_EQ(st, st_full);
}

TEST(MlaKernel, AbsorbedMatchesExpanded) {
  MlaDims d{3, 8, 4, 6, 16, 1.0f / std::sqrt(12.0f)};
  const int64_t N = 11, T = 4;  // 7 cached tokens + 4 new queries
  std::vector<float> q = randn(T * d.H * (d.nope + d.rope), 51);
  std::vector<float> c_kv = randn(N * d.r, 52), k_rot = randn(N * d.rope, 53);
  std::vector<float> wkvb = randn(d.H * (d.nope + d.v) * d.r, 54, 0.3f);
  TensorView W = f32_view(wkvb, {d.H * (d.nope + d.v), d.r});
  // Expanded: kv[j] = W c_kv[j].
  std::vector<float> kv(N * d.H * (d.nope + d.v), 0.0f);
  for (int64_t j = 0; j < N; ++j)
    for (int64_t n = 0; n < d.H * (d.nope + d.v); ++n)
      for (int64_t c = 0; c < d.r; ++c)
        kv[j * d.H * (d.nope + d.v) + n] += wkvb[n * d.r + c] * c_kv[j * d.r + c];
  std::vector<float> o_e(T * d.H * d.v), o_a(T * d.H * d.v);
  std::vector<float> s_e(mla_expanded_scratch_floats(N, T)),
      s_a(mla_absorbed_scratch_floats(d, N, T));
  mla_attend_expanded(d, q.data(), T, kv.data(), k_rot.data(), N, o_e.data(), s_e.data());
  mla_attend_absorbed(d, q.data(), T, c_kv.data(), k_rot.data(), N,
                      TestAbsorbedWeights(W, d).view(), o_a.data(), s_a.data());
  EXPECT_LT(max_abs_diff(o_e, o_a), 1e-5f);
  // Causality: the first new query (position 7) must ignore tokens 8..10.
  std::vector<float> kv2 = kv, kr2 = k_rot;
  for (int64_t j = 8; j < N; ++j) {
    for (int64_t n = 0; n < d.H * (d.nope + d.v); ++n) kv2[j * d.H * (d.nope + d.v) + n] = 100.0f;
    for (int64_t i = 0; i < d.rope; ++i) kr2[j * d.rope + i] = 100.0f;
  }
  std::vector<float> o_c(o_e.size());
  mla_attend_expanded(d, q.data(), T, kv2.data(), kr2.data(), N, o_c.data(), s_e.data());
  for (int64_t i = 0; i < d.H * d.v; ++i) EXPECT_EQ(o_c[i], o_e[i]);
}

TEST(RouterKernel, BiasSelectsButDoesNotWeight) {
  // Scores s = sigmoid(logit). Bias promotes expert 3 into the top-2; its weight stays s[3].
  const int64_t E = 5;
  std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f, 0.0f};
  std::vector<float> bias = {0.0f, 0.0f, 0.0f, 0.9f, 0.0f};
  RouterOptions opt;
  opt.top_k = 2;
  opt.scaling = 2.5f;
  int32_t ids[2];
  float w[2], scratch[5];
  route_sigmoid_topk(logits.data(), bias.data(), 1, E, opt, ids, w, scratch);
  // biased: 0.881, 0.731, 0.622, 0.269+0.9=1.169, 0.5 -> {3, 0}
  EXPECT_EQ(ids[0], 3);
  EXPECT_EQ(ids[1], 0);
  const float s3 = sigmoidf(-1.0f), s0 = sigmoidf(2.0f);
  EXPECT_FLOAT_EQ(w[0], s3 / (s3 + s0 + 1e-20f) * 2.5f);
  EXPECT_FLOAT_EQ(w[1], s0 / (s3 + s0 + 1e-20f) * 2.5f);
  // Without renormalisation: raw scores times the scaling factor.
  opt.renormalize = false;
  route_sigmoid_topk(logits.data(), bias.data(), 1, E, opt, ids, w, scratch);
  EXPECT_FLOAT_EQ(w[0], s3 * 2.5f);
  // The misreading (bias in the weights) gives visibly different weights.
  opt.renormalize = true;
  opt.bias_in_weights = true;
  route_sigmoid_topk(logits.data(), bias.data(), 1, E, opt, ids, w, scratch);
  EXPECT_GT(std::fabs(w[0] - s3 / (s3 + s0) * 2.5f), 0.5f);
}

TEST(Activation, SituValues) {
  // Independent values (python math): b * tanh(g/b) * sigmoid(g) * bl * tanh(u/bl), b=4, bl=25.
  EXPECT_NEAR(situf(8.0f, 50.0f, 4.0f, 25.0f), 92.90375177797013, 1e-4);
  EXPECT_NEAR(situf(0.5f, -2.0f, 4.0f, 25.0f), -0.6179198236701147, 1e-6);
  EXPECT_NEAR(situf(-3.0f, 10.0f, 4.0f, 25.0f), -1.1445010208474224, 1e-6);
  EXPECT_NEAR(situf(10.0f, -100.0f, 4.0f, 25.0f), -98.59078155386423, 1e-4);
  std::vector<float> g = {8.0f, 0.5f}, u = {50.0f, -2.0f};
  situ(g.data(), u.data(), 2, 4.0f, 25.0f, false, g.data());  // aliasing the gate
  EXPECT_NEAR(g[0], 92.90375177797013, 1e-4);
  EXPECT_NEAR(g[1], -0.6179198236701147, 1e-6);
}

TEST(NormKernel, RmsNormAliasingAndBf16) {
  std::vector<float> x = randn(3 * 16, 61), gain = randn(16, 62);
  TensorView gv = f32_view(gain, {16});
  std::vector<float> y(x.size()), xa = x;
  rms_norm(x.data(), 3, 16, gv, 1e-5f, false, y.data());
  rms_norm(xa.data(), 3, 16, gv, 1e-5f, false, xa.data());
  EXPECT_EQ(xa, y);
  float ss = 0.0f;
  for (int i = 0; i < 16; ++i) ss += x[i] * x[i];
  EXPECT_FLOAT_EQ(y[0], x[0] / std::sqrt(ss / 16.0f + 1e-5f) * gain[0]);
  std::vector<float> yb(x.size());
  rms_norm(x.data(), 3, 16, gv, 1e-5f, true, yb.data());
  for (float v : yb) EXPECT_EQ(v, round_bf16(v));
  EXPECT_LT(max_abs_diff(y, yb), 0.05f);
}

}  // namespace
}  // namespace attnres

namespace attnres {
namespace {

// Latent cache storage: f32 exact; bf16 within half a bf16 ulp; fp8 e4m3 with per-token,
// per-part scales within half an e4m3 ulp (2^-4 relative for normals, 2^-10 * scale absolute
// in the subnormal range).
TEST(LatentCacheStorage, RoundTripErrorBounds) {
  const int64_t r = 64, R = 16, T = 9;
  std::vector<float> c_kv = randn(T * r, 71), k_rot = randn(T * R, 72, 30.0f);
  for (int64_t i = 0; i < r; ++i) c_kv[i] = 0.0f;  // an all-zero part: scale 1, exact zeros
  ModelConfig c;
  c.kv_lora_rank = r;
  c.qk_rope_head_dim = R;
  c.schedule.num_mla = 2;
  for (KvCacheDtype dt : {KvCacheDtype::kF32, KvCacheDtype::kBF16, KvCacheDtype::kFP8}) {
    KvPool pool(c, dt, /*page_tokens=*/4);
    SequenceCache cache(&pool);
    // Two writes across pages into layer 1: rows keep their own scales.
    ASSERT_TRUE(cache.reserve(4).is_ok());
    cache.write(1, 0, c_kv.data(), k_rot.data(), 4);
    cache.set_size(4);
    ASSERT_TRUE(cache.reserve(T).is_ok());
    cache.write(1, 4, c_kv.data() + 4 * r, k_rot.data() + 4 * R, T - 4);
    cache.set_size(T);
    ASSERT_EQ(cache.num_pages(), 3);
    std::vector<float> c2(T * r), k2(T * R);
    cache.read(1, T, c2.data(), k2.data());
    for (int part = 0; part < 2; ++part) {
      const std::vector<float>& x = part == 0 ? c_kv : k_rot;
      const std::vector<float>& y = part == 0 ? c2 : k2;
      const int64_t w = part == 0 ? r : R;
      for (int64_t t = 0; t < T; ++t) {
        float amax = 0.0f;
        for (int64_t i = 0; i < w; ++i) amax = std::max(amax, std::fabs(x[t * w + i]));
        const float scale = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
        for (int64_t i = 0; i < w; ++i) {
          const float a = x[t * w + i], b = y[t * w + i];
          float bound = 0.0f;
          if (dt == KvCacheDtype::kBF16) bound = std::fabs(a) * std::ldexp(1.0f, -8);
          if (dt == KvCacheDtype::kFP8)
            bound = std::max(std::fabs(a) * 0.0625f, scale * std::ldexp(1.0f, -10)) * 1.0001f;
          ASSERT_LE(std::fabs(a - b), bound) << kv_cache_dtype_name(dt) << " t" << t << " i" << i;
        }
      }
    }
  }
  c.kv_lora_rank = 512;
  c.qk_rope_head_dim = 64;
  EXPECT_EQ(KvPool(c, KvCacheDtype::kFP8, 64).bytes_per_token_per_layer(), 576 + 8);
  EXPECT_EQ(KvPool(c, KvCacheDtype::kBF16, 64).bytes_per_token_per_layer(), 1152);
}

TEST(ArenaStorage, AlignedDisjointAndCoalescedOnReset) {
  Arena arena;
  float* a = arena.take<float>(100);
  float* b = arena.take<float>(3 << 20);  // forces a second block
  int32_t* c = arena.take<int32_t>(7);
  for (const void* p :
       {static_cast<const void*>(a), static_cast<const void*>(b), static_cast<const void*>(c)})
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_TRUE(b >= a + 100 || b + (3 << 20) <= a);
  a[99] = 1.0f;
  b[0] = 2.0f;
  b[(3 << 20) - 1] = 3.0f;
  EXPECT_EQ(a[99], 1.0f);
  const int64_t allocs = arena.heap_allocations();
  EXPECT_GE(allocs, 2);
  arena.reset();  // two blocks -> one of their total size
  EXPECT_EQ(arena.heap_allocations(), allocs + 1);
  const size_t cap = arena.capacity_bytes();
  arena.take<float>(100);
  arena.take<float>(3 << 20);
  arena.take<int32_t>(7);
  arena.reset();
  EXPECT_EQ(arena.heap_allocations(), allocs + 1);  // the same shape fits: nothing allocated
  EXPECT_EQ(arena.capacity_bytes(), cap);
}

}  // namespace
}  // namespace attnres
