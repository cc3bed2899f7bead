#include "f64_forward.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace attnres::testing {
namespace {

using Vec = std::vector<double>;

// ---- weights as stored, widened -------------------------------------------------------------

Vec widen(const TensorView& t) {
  Vec v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.get_f32(i);
  return v;
}

// A [rows, cols] matrix (y = W x), widened once.
struct Mat {
  int64_t rows = 0, cols = 0;
  Vec w;  // [rows, cols]
};

Mat dense(const TensorView& t) {
  return {t.shape[0], t.numel() / t.shape[0], widen(t)};
}

// MXFP4 (OCP): two E2M1 codes per byte, the low nibble the even element; one E8M0 scale
// (2^(s - 127)) per 32 elements along a row.
double e2m1(unsigned code) {
  static constexpr double kMagnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (code & 8u ? -1.0 : 1.0) * kMagnitude[code & 7u];
}

Mat expert(const ExpertMatrix& e) {
  if (!e.mxfp4) return dense(e.dense);
  Mat m{e.rows, e.cols, Vec(static_cast<size_t>(e.rows * e.cols))};
  const auto* packed = e.packed.as<uint8_t>();
  const auto* scale = e.scale.as<uint8_t>();
  for (int64_t r = 0; r < e.rows; ++r)
    for (int64_t k = 0; k < e.cols; ++k) {
      const uint8_t byte = packed[r * (e.cols / 2) + k / 2];
      const unsigned code = k % 2 == 0 ? byte & 0xfu : byte >> 4u;
      const double s = std::ldexp(1.0, int{scale[r * (e.cols / 32) + k / 32]} - 127);
      m.w[static_cast<size_t>(r * e.cols + k)] = e2m1(code) * s;
    }
  return m;
}

// ---- row operations over [T, n] activations ---------------------------------------------------

// y [T, rows] = x [T, cols] W^T
Vec linear(const Vec& x, int64_t T, const Mat& W) {
  Vec y(static_cast<size_t>(T * W.rows));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < W.rows; ++r) {
      double acc = 0.0;
      for (int64_t c = 0; c < W.cols; ++c) acc += W.w[r * W.cols + c] * x[t * W.cols + c];
      y[t * W.rows + r] = acc;
    }
  return y;
}
Vec linear(const Vec& x, int64_t T, const TensorView& W) {
  return linear(x, T, dense(W));
}

// Per group of D values: x * rsqrt(mean(x^2) + eps) * gain (gain empty: 1).
Vec rms_norm(const Vec& x, int64_t D, const Vec& gain, double eps) {
  Vec y(x.size());
  for (size_t r = 0; r < x.size() / D; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < D; ++i) ss += x[r * D + i] * x[r * D + i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
    for (int64_t i = 0; i < D; ++i)
      y[r * D + i] = x[r * D + i] * inv * (gain.empty() ? 1 : gain[i]);
  }
  return y;
}
Vec rms_norm(const Vec& x, int64_t D, const TensorView& gain, double eps) {
  return rms_norm(x, D, gain.data ? widen(gain) : Vec{}, eps);
}

double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// The gated activation of the config: SiTU(g, u) = b tanh(g / b) sigmoid(g) bl tanh(u / bl),
// or SiLU(g) u.
Vec activate(const ModelConfig& c, const Vec& g, const Vec& u) {
  Vec y(g.size());
  const double b = c.situ_beta, bl = c.situ_linear_beta;
  for (size_t i = 0; i < g.size(); ++i)
    y[i] = c.hidden_act == Activation::kSitu
               ? b * std::tanh(g[i] / b) * sigmoid(g[i]) * bl * std::tanh(u[i] / bl)
               : g[i] * sigmoid(g[i]) * u[i];
  return y;
}

Vec gated_mlp(const ModelConfig& c, const Vec& x, int64_t T, const TensorView& gate,
              const TensorView& up, const TensorView& down) {
  return linear(activate(c, linear(x, T, gate), linear(x, T, up)), T, down);
}

// ---- KDA (section 3) -------------------------------------------------------------------------

Vec kda(const ModelConfig& c, const KdaWeights& w, const Vec& x, int64_t T) {
  const int64_t H = c.linear.num_heads, dk = c.linear.head_dim, dv = dk, P = H * dk;
  const int64_t W = c.linear.short_conv_kernel_size;
  // q, k, v = SiLU(causal depthwise conv(W x)); the conv weight is [P, 1, W], oldest tap first.
  auto conv_silu = [&](const TensorView& proj, const TensorView& conv) {
    const Vec y = linear(x, T, proj), cw = widen(conv);
    Vec out(y.size());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t ch = 0; ch < P; ++ch) {
        double acc = 0.0;
        for (int64_t j = 0; j < W; ++j) {
          const int64_t src = t - (W - 1) + j;
          if (src >= 0) acc += cw[ch * W + j] * y[src * P + ch];
        }
        out[t * P + ch] = acc * sigmoid(acc);
      }
    return out;
  };
  Vec q = conv_silu(w.q_proj, w.q_conv), k = conv_silu(w.k_proj, w.k_conv);
  const Vec v = conv_silu(w.v_proj, w.v_conv);
  // L2 norm per head, x / sqrt(sum(x^2) + 1e-6); q scaled by dk^-1/2.
  auto l2 = [&](Vec& a, double scale) {
    for (int64_t r = 0; r < T * H; ++r) {
      double ss = 0.0;
      for (int64_t i = 0; i < dk; ++i) ss += a[r * dk + i] * a[r * dk + i];
      const double inv = scale / std::sqrt(ss + 1e-6);
      for (int64_t i = 0; i < dk; ++i) a[r * dk + i] *= inv;
    }
  };
  l2(q, 1.0 / std::sqrt(static_cast<double>(dk)));
  l2(k, 1.0);
  // Forget gate per channel (A_log per head: the first H stored values), beta per head.
  const Vec f = linear(linear(x, T, w.f_a_proj), T, w.f_b_proj);
  const Vec dt_bias = widen(w.dt_bias);
  Vec g(static_cast<size_t>(T * P));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t ch = 0; ch < P; ++ch) {
      const double a = std::exp(static_cast<double>(w.a_log_stored.get_f32(ch / dk)));
      const double z = f[t * P + ch] + dt_bias[ch];
      g[t * P + ch] = c.linear.gate_lower_bound ? *c.linear.gate_lower_bound * sigmoid(a * z)
                                                : -a * (z > 30 ? z : std::log1p(std::exp(z)));
    }
  Vec beta = linear(x, T, w.b_proj);
  for (double& b : beta) b = sigmoid(b);
  // The delta rule token by token: S = diag(exp(g)) S; S += beta k (v - S^T k)^T; o = S^T q.
  Vec o(static_cast<size_t>(T * H * dv));
  for (int64_t h = 0; h < H; ++h) {
    Vec S(static_cast<size_t>(dk * dv), 0.0);  // [dk, dv]
    Vec delta(static_cast<size_t>(dv));
    for (int64_t t = 0; t < T; ++t) {
      const int64_t r = t * H + h;
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] *= std::exp(g[r * dk + i]);
      for (int64_t j = 0; j < dv; ++j) {
        double sk = 0.0;
        for (int64_t i = 0; i < dk; ++i) sk += S[i * dv + j] * k[r * dk + i];
        delta[j] = beta[r] * (v[r * dv + j] - sk);
      }
      for (int64_t i = 0; i < dk; ++i)
        for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += k[r * dk + i] * delta[j];
      for (int64_t j = 0; j < dv; ++j) {
        double sq = 0.0;
        for (int64_t i = 0; i < dk; ++i) sq += S[i * dv + j] * q[r * dk + i];
        o[r * dv + j] = sq;
      }
    }
  }
  // Output: RMSNorm per head * o_norm * sigmoid(gate), then o_proj.
  const Vec gate = c.linear.use_full_rank_gate ? linear(x, T, w.g_proj)
                                               : linear(linear(x, T, w.g_a_proj), T, w.g_b_proj);
  Vec on = rms_norm(o, dv, w.o_norm, c.rms_norm_eps);
  for (size_t i = 0; i < on.size(); ++i) on[i] *= sigmoid(gate[i]);
  return linear(on, T, w.o_proj);
}

// ---- MLA (section 4), expanded keys, causal over the T rows -----------------------------------

Vec mla(const ModelConfig& c, const MlaWeights& w, const Vec& x, int64_t T) {
  const int64_t H = c.num_attention_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim;
  const int64_t vd = c.v_head_dim, r = c.kv_lora_rank, qw = nope + rope, kvw = nope + vd;
  constexpr double kLatentEps = 1e-6;  // q_a_layernorm / kv_a_layernorm in the official code
  const Vec q =
      c.q_lora_rank > 0
          ? linear(rms_norm(linear(x, T, w.q_a_proj), c.q_lora_rank, w.q_a_norm, kLatentEps), T,
                   w.q_b_proj)
          : linear(x, T, w.q_proj);           // [T, H, nope + rope]
  const Vec kva = linear(x, T, w.kv_a_proj);  // [T, r + rope]
  Vec c_kv(static_cast<size_t>(T * r)), k_rot(static_cast<size_t>(T * rope));
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(kva.begin() + t * (r + rope), r, c_kv.begin() + t * r);
    std::copy_n(kva.begin() + t * (r + rope) + r, rope, k_rot.begin() + t * rope);
  }
  const Vec kv = linear(rms_norm(c_kv, r, w.kv_a_norm, kLatentEps), T, w.kv_b_proj);
  const double scale = 1.0 / std::sqrt(static_cast<double>(qw));
  Vec o(static_cast<size_t>(T * H * vd), 0.0), p(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const double* qt = &q[(t * H + h) * qw];
      double mx = -INFINITY;
      for (int64_t s = 0; s <= t; ++s) {
        const double* ks = &kv[(s * H + h) * kvw];
        double dot = 0.0;
        for (int64_t i = 0; i < nope; ++i) dot += qt[i] * ks[i];
        for (int64_t i = 0; i < rope; ++i) dot += qt[nope + i] * k_rot[s * rope + i];
        p[s] = dot * scale;
        mx = std::max(mx, p[s]);
      }
      double sum = 0.0;
      for (int64_t s = 0; s <= t; ++s) sum += p[s] = std::exp(p[s] - mx);
      for (int64_t s = 0; s <= t; ++s)
        for (int64_t j = 0; j < vd; ++j)
          o[(t * H + h) * vd + j] += p[s] / sum * kv[(s * H + h) * kvw + nope + j];
    }
  if (w.g_proj.data != nullptr) {
    const Vec gate = linear(x, T, w.g_proj);
    for (size_t i = 0; i < o.size(); ++i) o[i] *= sigmoid(gate[i]);
  }
  return linear(o, T, w.o_proj);
}

// ---- latent MoE and dense MLP (section 5) ------------------------------------------------------

Vec moe(const ModelConfig& c, const MoeWeights& w, const Vec& x, int64_t T) {
  const int64_t d = c.hidden_size, E = c.num_experts, K = c.num_experts_per_token;
  const bool latent = c.routed_expert_hidden_size.has_value();
  const int64_t rd = latent ? *c.routed_expert_hidden_size : d;
  const Vec scores = linear(x, T, w.gate);  // [T, E] router logits
  const Vec bias = w.gate_bias.data ? widen(w.gate_bias) : Vec(static_cast<size_t>(E), 0.0);
  const Vec z = latent ? linear(x, T, w.latent_down) : x;  // [T, rd]
  Vec y(static_cast<size_t>(T * rd), 0.0);
  std::vector<Mat> w1(static_cast<size_t>(E)), w2(w1.size()), w3(w1.size());
  std::vector<int> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    Vec s(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) s[e] = sigmoid(scores[t * E + e]);
    // top-k of s + bias (selection only); weights = the unbiased s, renormalised and scaled
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return s[a] + bias[a] > s[b] + bias[b]; });
    double sum = 0.0;
    for (int64_t i = 0; i < K; ++i) sum += s[order[i]];
    const Vec zt(z.begin() + t * rd, z.begin() + (t + 1) * rd);
    for (int64_t i = 0; i < K; ++i) {
      const int e = order[i];
      const double wt = (c.moe_renormalize ? s[e] / (sum + 1e-20) : s[e]) * c.routed_scaling_factor;
      if (w1[e].w.empty()) {
        w1[e] = expert(w.experts[e].w1);
        w2[e] = expert(w.experts[e].w2);
        w3[e] = expert(w.experts[e].w3);
      }
      const Vec eo = linear(activate(c, linear(zt, 1, w1[e]), linear(zt, 1, w3[e])), 1, w2[e]);
      for (int64_t j = 0; j < rd; ++j) y[t * rd + j] += wt * eo[j];
    }
  }
  Vec routed = y;
  if (latent) {
    if (w.latent_norm.data != nullptr) y = rms_norm(y, rd, w.latent_norm, c.rms_norm_eps);
    routed = linear(y, T, w.latent_up);
  }
  if (c.num_shared_experts > 0) {
    const Vec sh = gated_mlp(c, x, T, w.shared_gate, w.shared_up, w.shared_down);
    for (size_t i = 0; i < routed.size(); ++i) routed[i] += sh[i];
  }
  return routed;
}

// ---- Block AttnRes (section 2) ---------------------------------------------------------------

// q = res_norm.weight * res_proj.weight; per row: score_j = dot(v_j, q) / sqrt(mean(v_j^2) +
// eps), p = softmax(score), out = sum_j p_j v_j over the sources.
Vec attnres_read(const std::vector<const Vec*>& sources, const TensorView& norm,
                 const TensorView& proj, int64_t T, int64_t d, double eps) {
  const Vec gn = widen(norm), pr = widen(proj);
  Vec out(static_cast<size_t>(T * d), 0.0);
  Vec score(sources.size());
  for (int64_t t = 0; t < T; ++t) {
    for (size_t j = 0; j < sources.size(); ++j) {
      const double* v = &(*sources[j])[t * d];
      double dot = 0.0, ss = 0.0;
      for (int64_t i = 0; i < d; ++i) {
        dot += v[i] * gn[i] * pr[i];
        ss += v[i] * v[i];
      }
      score[j] = dot / std::sqrt(ss / static_cast<double>(d) + eps);
    }
    const double mx = *std::max_element(score.begin(), score.end());
    double sum = 0.0;
    for (double& s : score) sum += s = std::exp(s - mx);
    for (size_t j = 0; j < sources.size(); ++j)
      for (int64_t i = 0; i < d; ++i) out[t * d + i] += score[j] / sum * (*sources[j])[t * d + i];
  }
  return out;
}

}  // namespace

std::vector<double> f64_forward(const ModelWeights& w, std::span<const int32_t> tokens) {
  const ModelConfig& c = w.config;
  const int64_t T = static_cast<int64_t>(tokens.size()), d = c.hidden_size;
  const double eps = c.rms_norm_eps;
  Vec running(static_cast<size_t>(T * d));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d; ++i) running[t * d + i] = w.embed.get_f32(tokens[t] * d + i);
  auto attention = [&](int i, const Vec& h) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(i)];
    const Vec x = rms_norm(h, d, lw.input_norm, eps);
    return lw.kda ? kda(c, *lw.kda, x, T) : mla(c, *lw.mla, x, T);
  };
  auto mlp = [&](int i, const Vec& h) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(i)];
    const Vec x = rms_norm(h, d, lw.post_attn_norm, eps);
    return lw.moe ? moe(c, *lw.moe, x, T)
                  : gated_mlp(c, x, T, lw.dense->gate, lw.dense->up, lw.dense->down);
  };
  auto add = [](Vec& acc, const Vec& x) {
    for (size_t i = 0; i < acc.size(); ++i) acc[i] += x[i];
  };
  const int layers = c.schedule.num_layers();
  if (!c.attn_res_block_size) {  // plain residual
    for (int i = 0; i < layers; ++i) {
      add(running, attention(i, running));
      add(running, mlp(i, running));
    }
  } else {
    const int B = *c.attn_res_block_size;
    std::vector<Vec> bank;
    bank.reserve(static_cast<size_t>(layers / B + 1));
    auto read = [&](const TensorView& norm, const TensorView& proj) {
      std::vector<const Vec*> sources;
      for (const Vec& slot : bank) sources.push_back(&slot);
      sources.push_back(&running);
      return attnres_read(sources, norm, proj, T, d, eps);
    };
    for (int i = 0; i < layers; ++i) {
      const LayerWeights& lw = w.layers[static_cast<size_t>(i)];
      // layer 0 reads nothing: its input is the embedding itself
      const Vec h = bank.empty() ? running : read(lw.attn_res_norm, lw.attn_res_proj);
      const Vec a = attention(i, h);
      if (i % B == 0) {  // commit the raw running sum; the block restarts with a
        bank.push_back(running);
        running = a;
      } else {
        add(running, a);
      }
      add(running, mlp(i, read(lw.mlp_res_norm, lw.mlp_res_proj)));
    }
    running = read(w.out_res_norm, w.out_res_proj);
  }
  return linear(rms_norm(running, d, w.final_norm, eps), T, w.lm_head);
}

}  // namespace attnres::testing
