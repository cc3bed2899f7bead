// Feed-forward sublayers (k3-model.md §5): the latent MoE (sigmoid router with selection bias,
// routed experts in a latent space, shared experts) and the dense SiTU MLP of layer 0.
//
// Every token's arithmetic depends only on that token: its experts run on its own row (the
// expert products are row-invariant, matmul.h) and its weighted expert outputs are summed in
// expert index order, whichever other tokens share the step.
#include <algorithm>
#include <cstring>

#include "kernels/norm.h"
#include "kernels/router.h"
#include "model/blocks.h"
#include "model/projection.h"

namespace attnres {
namespace {

// Routed experts run over slices of at most this many tokens (scratch ~ slice * top_k rows).
constexpr int64_t kMoeTokenSlice = 512;

struct MoeDims {
  int64_t d, E, K, I, r, Is;
  bool latent, shared;
};

MoeDims moe_dims(const ModelConfig& c, const MoeWeights& w) {
  MoeDims m;
  m.d = c.hidden_size;
  m.E = c.num_experts;
  m.K = c.num_experts_per_token;
  m.I = c.moe_intermediate_size;
  m.latent = c.routed_expert_hidden_size.has_value();
  m.r = m.latent ? *c.routed_expert_hidden_size : m.d;
  m.shared = c.num_shared_experts > 0;
  m.Is = m.shared ? w.shared_gate.shape[0] : 0;
  return m;
}

// Everything that reads x, in one batch: the router logits (f32 over the full-width input,
// x.float() @ W_r.float(), not rounded), the latent down projection and the shared MLP's gate
// and up projections (bf16 nn.Linear outputs).
void project_inputs(const MoeWeights& w, const MoeDims& m, const Proj& pj, const float* x,
                    int64_t T, float* logits, float* zl, float* sg, float* su) {
  MatmulJob jobs[4];
  int n = 0;
  jobs[n++] = dense_job(x, T, w.gate, logits);
  if (m.latent) jobs[n++] = dense_job(x, T, w.latent_down, zl);
  if (m.shared) {
    jobs[n++] = dense_job(x, T, w.shared_gate, sg);
    jobs[n++] = dense_job(x, T, w.shared_up, su);
  }
  project_batch(pj, jobs, n, /*first_rounded=*/1);  // the router logits stay f32
}

// y [T, r] += sum over each token's chosen experts of weight * expert(z), f32, in slices of
// kMoeTokenSlice tokens; within a slice the (token, choice) pairs are grouped by expert so
// each chosen expert's matrices are read once, and summed back in that (expert index) order.
void routed_experts(const ModelConfig& c, const MoeWeights& w, const MoeDims& m, const Proj& pj,
                    const float* z, const int32_t* ids, const float* wts, int64_t T, float* y) {
  Arena& arena = pj.arena;
  const int64_t E = m.E, K = m.K, I = m.I, r = m.r;
  const int64_t S = std::min<int64_t>(T, kMoeTokenSlice);
  int64_t* count = arena.take<int64_t>(E + 1);
  int64_t* fill = arena.take<int64_t>(E);
  int64_t* slot_of = arena.take<int64_t>(S * K);  // grouped position -> flat (t * K + s)
  float* zg = arena.take<float>(S * K * r);       // [S*K, r] gathered inputs, grouped by expert
  float* h1 = arena.take<float>(S * K * I);       // [S*K, I]
  float* h3 = arena.take<float>(S * K * I);       // [S*K, I]
  float* eo = arena.take<float>(S * K * r);       // [S*K, r]
  MatmulJob* jobs = arena.take<MatmulJob>(2 * std::min(E, S * K));
  for (int64_t t0 = 0; t0 < T; t0 += S) {
    const int64_t ts = std::min(S, T - t0), base = t0 * K;
    // Token lists per expert (counting sort).
    std::fill(count, count + E + 1, 0);
    for (int64_t i = 0; i < ts * K; ++i) ++count[ids[base + i] + 1];
    for (int64_t e = 0; e < E; ++e) count[e + 1] += count[e];
    std::copy(count, count + E, fill);
    for (int64_t i = 0; i < ts * K; ++i) slot_of[fill[ids[base + i]]++] = base + i;
    for (int64_t g = 0; g < ts * K; ++g)
      std::memcpy(zg + g * r, z + slot_of[g] / K * r, sizeof(float) * static_cast<size_t>(r));
    // w1 and w3 of every chosen expert in one batch, then w2 of every chosen expert.
    int64_t nj = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t begin = count[e], n = count[e + 1] - begin;
      if (n == 0) continue;
      const ExpertWeights& ew = w.experts[static_cast<size_t>(e)];
      jobs[nj++] = expert_job(zg + begin * r, n, ew.w1, h1 + begin * I);
      jobs[nj++] = expert_job(zg + begin * r, n, ew.w3, h3 + begin * I);
    }
    project_batch(pj, jobs, nj);
    gated_activation(c, h1, h3, ts * K * I, pj.bf16, h1);
    nj = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t begin = count[e], n = count[e + 1] - begin;
      if (n > 0)
        jobs[nj++] =
            expert_job(h1 + begin * I, n, w.experts[static_cast<size_t>(e)].w2, eo + begin * r);
    }
    project_batch(pj, jobs, nj);
    for (int64_t g = 0; g < ts * K; ++g) {
      const int64_t flat = slot_of[g], t = flat / K;
      const float wt = wts[flat];
      for (int64_t i = 0; i < r; ++i) y[t * r + i] += wt * eo[g * r + i];
    }
  }
}

}  // namespace

void moe_block(const ModelConfig& c, const MoeWeights& w, const float* x, int64_t T,
               const ForwardOptions& opt, Arena& arena, float* out) {
  const Proj pj = make_proj(opt, arena);
  const bool bf16 = opt.bf16();
  const MoeDims m = moe_dims(c, w);
  float* logits = arena.take<float>(T * m.E);                    // [T, E]
  float* zl = m.latent ? arena.take<float>(T * m.r) : nullptr;   // [T, r]
  float* sg = m.shared ? arena.take<float>(T * m.Is) : nullptr;  // [T, Is]
  float* su = m.shared ? arena.take<float>(T * m.Is) : nullptr;  // [T, Is]
  project_inputs(w, m, pj, x, T, logits, zl, sg, su);

  // Router: top-k experts per token and their combine weights.
  int32_t* ids = arena.take<int32_t>(T * m.K);  // [T, K]
  float* wts = arena.take<float>(T * m.K);      // [T, K]
  RouterOptions ro;
  ro.top_k = m.K;
  ro.renormalize = c.moe_renormalize;
  ro.scaling = c.routed_scaling_factor;
  ro.bias_in_weights = w.combine_with_bias;
  route_sigmoid_topk(logits, w.gate_bias.data ? widen(w.gate_bias, arena) : nullptr, T, m.E, ro,
                     ids, wts, arena.take<float>(T * m.E));

  // Routed branch in the latent space (f32 accumulation, then a bf16 value).
  float* y = arena.take<float>(T * m.r);  // [T, r]
  std::fill(y, y + T * m.r, 0.0f);
  routed_experts(c, w, m, pj, m.latent ? zl : x, ids, wts, T, y);
  round_to_bf16(y, T * m.r, bf16);

  // Back to the model width and the shared MLP's down projection, in one batch.
  float* routed = y;                                            // [T, d]
  float* sh = m.shared ? arena.take<float>(T * m.d) : nullptr;  // [T, d]
  MatmulJob last[2];
  int n = 0;
  if (m.latent) {
    if (w.latent_norm.data != nullptr) rms_norm(y, T, m.r, w.latent_norm, c.rms_norm_eps, bf16, y);
    routed = arena.take<float>(T * m.d);
    last[n++] = dense_job(y, T, w.latent_up, routed);
  }
  if (m.shared) {
    gated_activation(c, sg, su, T * m.Is, bf16, sg);
    last[n++] = dense_job(sg, T, w.shared_down, sh);
  }
  project_batch(pj, last, n);
  if (m.shared) {
    for (int64_t i = 0; i < T * m.d; ++i) out[i] = routed[i] + sh[i];
  } else {
    std::memcpy(out, routed, sizeof(float) * static_cast<size_t>(T * m.d));
  }
  round_to_bf16(out, T * m.d, bf16);
}

void linear(const ForwardOptions& opt, Arena& arena, const float* x, int64_t T, const Matrix& W,
            float* y) {
  project(make_proj(opt, arena), x, T, W, y);
}

void dense_mlp_block(const ModelConfig& c, const DenseMlpWeights& w, const float* x, int64_t T,
                     const ForwardOptions& opt, Arena& arena, float* out) {
  const Proj pj = make_proj(opt, arena);
  const int64_t I = w.gate.shape[0];
  float* g = arena.take<float>(T * I);                // [T, I]
  float* u = arena.take<float>(T * I);                // [T, I]
  float* tmp = arena.take<float>(T * c.hidden_size);  // [T, d] so that out may alias x
  MatmulJob jobs[2] = {dense_job(x, T, w.gate, g), dense_job(x, T, w.up, u)};
  project_batch(pj, jobs, 2);
  gated_activation(c, g, u, T * I, pj.bf16, g);
  project(pj, g, T, w.down, tmp);
  std::memcpy(out, tmp, sizeof(float) * static_cast<size_t>(T * c.hidden_size));
}

}  // namespace attnres
