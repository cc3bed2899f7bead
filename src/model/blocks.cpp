#include "model/blocks.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "kernels/activation.h"
#include "kernels/kda.h"
#include "kernels/matmul.h"
#include "kernels/mla.h"
#include "kernels/norm.h"
#include "kernels/router.h"

namespace attnres {
namespace {

// Routed experts run over slices of at most this many tokens (scratch ~ slice * top_k rows).
constexpr int64_t kMoeTokenSlice = 512;

// How a block runs its projections. In the bf16 flow every projection input is a bf16 value
// (norm outputs, projection outputs, activations and latents are rounded to bf16), so a
// BF16 or MXFP4 job can take a bf16 copy of its input and run on the AVX512_BF16 dot-product
// kernels (matmul.h: the same exact products, another fixed summation order). The copy is checked
// to be exact; an input that is not (never expected) keeps the f32 kernel.
struct Proj {
  Arena& arena;
  bool bf16 = false;  // round outputs to bf16 (a bf16 nn.Linear output)
  bool dot = false;   // give BF16 / MXFP4 jobs exact bf16 inputs
  ProjectionStats* stats = nullptr;
};

Proj make_proj(const ForwardOptions& opt, Arena& arena) {
  return Proj{arena, opt.bf16(), opt.bf16() && matmul_bf16_uses_dot_product(),
              opt.projection_stats};
}

// Sets xh on the BF16 and MXFP4 jobs (one copy per distinct input of the batch).
void attach_bf16_inputs(const Proj& pj, MatmulJob* jobs, int64_t n) {
  if (!pj.dot) return;
  for (int64_t i = 0; i < n; ++i) {
    MatmulJob& j = jobs[i];
    if (j.kind == WeightKind::kF32 || j.T <= 0 || j.xh != nullptr) continue;
    for (int64_t p = 0; p < i && j.xh == nullptr; ++p)
      if (jobs[p].x == j.x && jobs[p].T == j.T && jobs[p].K == j.K) j.xh = jobs[p].xh;
    if (j.xh != nullptr) continue;
    bf16* xh = pj.arena.take<bf16>(j.T * j.K);  // [T, K]
    if (bf16_exact_copy(j.x, j.T * j.K, xh)) j.xh = xh;
  }
}

// Runs the jobs in one parallel region, then rounds the outputs of jobs [first_rounded, n) to
// bf16 in the bf16 flow.
void project_batch(const Proj& pj, MatmulJob* jobs, int64_t n, int64_t first_rounded = 0) {
  attach_bf16_inputs(pj, jobs, n);
  if (pj.stats == nullptr) {
    matmul_batch(jobs, n);
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    matmul_batch(jobs, n);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t bytes = 0;
    bool mxfp4 = false;
    for (int64_t i = 0; i < n; ++i) {
      bytes += job_weight_bytes(jobs[i]);
      mxfp4 = mxfp4 || (jobs[i].kind == WeightKind::kMxfp4 && jobs[i].T > 0);
    }
    (mxfp4 ? pj.stats->mxfp4_seconds : pj.stats->dense_seconds) += dt;
    (mxfp4 ? pj.stats->mxfp4_bytes : pj.stats->dense_bytes) += bytes;
    ++pj.stats->batches;
  }
  for (int64_t i = first_rounded; i < n; ++i)
    round_to_bf16(jobs[i].y, jobs[i].T * jobs[i].N, pj.bf16);
}

// y [T, N] = x [T, K] W^T, rounded to bf16 in the bf16 flow (a bf16 nn.Linear output).
void project(const Proj& pj, const float* x, int64_t T, const Matrix& W, float* y) {
  MatmulJob j = dense_job(x, T, W, y);
  project_batch(pj, &j, 1);
}

MatmulJob expert_job(const float* x, int64_t T, const ExpertMatrix& m, float* y) {
  return m.mxfp4 ? mxfp4_job(x, T, m.packed.as<uint8_t>(), m.scale.as<uint8_t>(), m.rows, m.cols, y)
                 : dense_job(x, T, m.dense, y);
}

// A small F32/BF16 tensor (conv weights, biases) as f32 values: F32 data is used in place when
// it is 4-byte aligned (safetensors does not promise alignment), anything else is widened into
// arena memory. Called per step, so no per-element dtype dispatch.
const float* widen(const TensorView& t, Arena& arena) {
  if (t.dtype == DType::kF32 && reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0)
    return t.as<float>();
  const int64_t n = t.numel();
  float* out = arena.take<float>(n);
  if (t.dtype == DType::kBF16) {
    const bf16* src = t.as<bf16>();
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = t.get_f32(i);
  }
  return out;
}

void gated_activation(const ModelConfig& c, const float* gate, const float* up, int64_t n,
                      bool bf16_out, float* out) {
  if (c.hidden_act == Activation::kSitu)
    situ(gate, up, n, c.situ_beta, c.situ_linear_beta, bf16_out, out);
  else
    silu_mul(gate, up, n, bf16_out, out);
}

// down(act(gate(x), up(x))) over a [T, d] input; out [T, d] must not alias x.
void gated_mlp(const ModelConfig& c, const Matrix& gate, const Matrix& up, const Matrix& down,
               const float* x, int64_t T, const Proj& pj, float* out) {
  const bool bf16 = pj.bf16;
  Arena& arena = pj.arena;
  const int64_t I = gate.shape[0];
  float* g = arena.take<float>(T * I);  // [T, I]
  float* u = arena.take<float>(T * I);  // [T, I]
  project(pj, x, T, gate, g);
  project(pj, x, T, up, u);
  gated_activation(c, g, u, T * I, bf16, g);
  project(pj, g, T, down, out);
}

}  // namespace

void kda_block(const ModelConfig& c, const KdaWeights& w, const float* x, int64_t T,
               KdaState& state, const ForwardOptions& opt, Arena& arena, float* out) {
  const Proj pj = make_proj(opt, arena);
  const bool bf16 = opt.bf16();
  const int64_t H = c.linear.num_heads, dk = c.linear.head_dim, dv = dk;  // dv = head_dim too
  const int64_t P = H * dk;
  const int W = c.linear.short_conv_kernel_size;
  float* q = arena.take<float>(T * P);          // [T, H, dk]
  float* k = arena.take<float>(T * P);          // [T, H, dk]
  float* v = arena.take<float>(T * H * dv);     // [T, H, dv]
  float* fa = arena.take<float>(T * dk);        // [T, dk] f_a_proj x
  float* beta = arena.take<float>(T * H);       // [T, H] b_proj x, then sigmoid
  float* gate = arena.take<float>(T * H * dv);  // [T, H*dv] output gate (g_proj x)
  float* ga = c.linear.use_full_rank_gate ? nullptr : arena.take<float>(T * dv);  // [T, dv]
  {
    // Every projection of x at once (one parallel region); each is rounded like a bf16
    // nn.Linear output (beta too: b_proj's output is bf16, the sigmoid is f32).
    MatmulJob jobs[6] = {dense_job(x, T, w.q_proj, q),
                         dense_job(x, T, w.k_proj, k),
                         dense_job(x, T, w.v_proj, v),
                         dense_job(x, T, w.f_a_proj, fa),
                         dense_job(x, T, w.b_proj, beta),
                         c.linear.use_full_rank_gate ? dense_job(x, T, w.g_proj, gate)
                                                     : dense_job(x, T, w.g_a_proj, ga)};
    project_batch(pj, jobs, 6);
  }
  causal_conv1d_silu(q, T, P, widen(w.q_conv, arena), W, state.conv_q.data(), q);
  causal_conv1d_silu(k, T, P, widen(w.k_conv, arena), W, state.conv_k.data(), k);
  causal_conv1d_silu(v, T, H * dv, widen(w.v_conv, arena), W, state.conv_v.data(), v);
  round_to_bf16(q, T * P, bf16);
  round_to_bf16(k, T * P, bf16);
  round_to_bf16(v, T * H * dv, bf16);
  // fla's use_qk_l2norm_in_kernel: f32 L2 norm per head, q scaled by dk^-1/2.
  l2_norm(q, T * H, dk, ModelConfig::kKdaL2NormEps, 1.0f / std::sqrt(static_cast<float>(dk)), q);
  l2_norm(k, T * H, dk, ModelConfig::kKdaL2NormEps, 1.0f, k);

  // Forget gate g [T, H, dk] (log decay, f32).
  float* g = arena.take<float>(T * P);  // [T, H*dk]
  project(pj, fa, T, w.f_b_proj, g);
  const float* dt_bias = widen(w.dt_bias, arena);
  if (opt.mis.per_channel_a_log) {
    // Misreading: the padded A_log [head_dim] taken per channel within each head.
    float* f = arena.take<float>(T * P);
    std::memcpy(f, g, sizeof(float) * static_cast<size_t>(T * P));
    float one_head[1];
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < dk; ++i) {
          one_head[0] = i < H ? w.a_log[static_cast<size_t>(i)] : 0.0f;
          const int64_t ci = h * dk + i;
          kda_gate(f + t * P + ci, 1, 1, 1, one_head, dt_bias + ci, c.linear.gate_lower_bound,
                   g + t * P + ci);
        }
  } else {
    kda_gate(g, T, H, dk, w.a_log.data(), dt_bias, c.linear.gate_lower_bound, g);
  }
  for (int64_t i = 0; i < T * H; ++i) beta[i] = sigmoidf(beta[i]);

  float* o = arena.take<float>(T * H * dv);  // [T, H, dv]
  if (T == 1 || opt.kda_recurrent) {
    kda_recurrent(q, k, v, g, beta, T, H, dk, dv, state.recurrent.data(), o);
  } else {
    const int64_t chunk = std::max<int64_t>(1, opt.kda_chunk);
    float* scratch = arena.take<float>(kda_chunk_scratch_floats(H, chunk, dk, dv));
    kda_chunked(q, k, v, g, beta, T, H, dk, dv, chunk, state.recurrent.data(), o, scratch);
  }
  round_to_bf16(o, T * H * dv, bf16);

  if (!c.linear.use_full_rank_gate) project(pj, ga, T, w.g_b_proj, gate);
  gated_rms_norm(o, gate, T * H, dv, w.o_norm, c.rms_norm_eps, bf16, o);
  project(pj, o, T, w.o_proj, out);
}

void mla_block(const ModelConfig& c, const MlaWeights& w, const float* x, int64_t T,
               LatentCache& cache, const ForwardOptions& opt, Arena& arena, float* out) {
  const Proj pj = make_proj(opt, arena);
  const bool bf16 = opt.bf16();
  MlaDims md;
  md.H = c.num_attention_heads;
  md.nope = c.qk_nope_head_dim;
  md.rope = c.qk_rope_head_dim;
  md.v = c.v_head_dim;
  md.r = c.kv_lora_rank;
  md.scale = 1.0f / std::sqrt(static_cast<float>(md.nope + md.rope));
  const int64_t qw = md.nope + md.rope;
  const float eps = ModelConfig::kMlaLatentNormEps;

  const bool gated = w.g_proj.data != nullptr;
  const int64_t kvw = md.r + md.rope;
  float* q = arena.take<float>(T * md.H * qw);  // [T, H, nope + rope]
  float* cq = c.q_lora_rank > 0 ? arena.take<float>(T * c.q_lora_rank) : nullptr;  // [T, r_q]
  float* kva = arena.take<float>(T * kvw);                                         // [T, r + rope]
  float* gate = gated ? arena.take<float>(T * md.H * md.v) : nullptr;              // [T, H*v]
  {
    // The projections of x at once (one parallel region).
    MatmulJob jobs[3] = {cq ? dense_job(x, T, w.q_a_proj, cq) : dense_job(x, T, w.q_proj, q),
                         dense_job(x, T, w.kv_a_proj, kva)};
    int n = 2;
    if (gated) jobs[n++] = dense_job(x, T, w.g_proj, gate);
    project_batch(pj, jobs, n);
  }
  if (cq) {
    rms_norm(cq, T, c.q_lora_rank, w.q_a_norm, eps, bf16, cq);
    project(pj, cq, T, w.q_b_proj, q);
  }
  // [c_kv | k_rot] per token, then c_kv normalised; the cache gets the normalised latents.
  float* c_kv = arena.take<float>(T * md.r);      // [T, r]
  float* k_rot = arena.take<float>(T * md.rope);  // [T, rope]
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(c_kv + t * md.r, kva + t * kvw, sizeof(float) * static_cast<size_t>(md.r));
    std::memcpy(k_rot + t * md.rope, kva + t * kvw + md.r,
                sizeof(float) * static_cast<size_t>(md.rope));
  }
  rms_norm(c_kv, T, md.r, w.kv_a_norm, eps, bf16, c_kv);
  cache.append(c_kv, k_rot, T);

  // The whole context as stored (dequantised), so one-shot and chunked prefill and decode all
  // attend to the same values. The absorbed form reads a bf16 cache in place (bitwise the same
  // as on the widened copy), so decode copies no context.
  const int64_t N = cache.size();
  float* o = arena.take<float>(T * md.H * md.v);  // [T, H, v]
  const bool absorbed = T == 1 || opt.mla_absorbed;
  if (absorbed && cache.bf16_c_kv() != nullptr) {
    float* scratch = arena.take<float>(mla_absorbed_scratch_floats(md, N, T));
    mla_attend_absorbed(md, q, T, cache.bf16_c_kv(), cache.bf16_k_rot(), N, w.kv_b_proj, o,
                        scratch);
  } else {
    float* ctx_c = arena.take<float>(N * md.r);     // [N, r]
    float* ctx_k = arena.take<float>(N * md.rope);  // [N, rope]
    cache.read(N, ctx_c, ctx_k);
    if (absorbed) {
      float* scratch = arena.take<float>(mla_absorbed_scratch_floats(md, N, T));
      mla_attend_absorbed(md, q, T, ctx_c, ctx_k, N, w.kv_b_proj, o, scratch);
    } else {
      float* kv = arena.take<float>(N * md.H * (md.nope + md.v));  // [N, H, nope + v]
      project(pj, ctx_c, N, w.kv_b_proj, kv);
      float* scratch = arena.take<float>(mla_expanded_scratch_floats(N, T));
      mla_attend_expanded(md, q, T, kv, ctx_k, N, o, scratch);
    }
  }
  round_to_bf16(o, T * md.H * md.v, bf16);
  if (gated) {
    for (int64_t i = 0; i < T * md.H * md.v; ++i) o[i] *= sigmoidf(gate[i]);
    round_to_bf16(o, T * md.H * md.v, bf16);
  }
  project(pj, o, T, w.o_proj, out);
}

void moe_block(const ModelConfig& c, const MoeWeights& w, const float* x, int64_t T,
               const ForwardOptions& opt, Arena& arena, float* out) {
  const Proj pj = make_proj(opt, arena);
  const bool bf16 = opt.bf16();
  const int64_t d = c.hidden_size, E = c.num_experts, K = c.num_experts_per_token;
  const int64_t I = c.moe_intermediate_size;
  const bool latent = c.routed_expert_hidden_size.has_value();
  const int64_t r = latent ? *c.routed_expert_hidden_size : d;
  const bool shared = c.num_shared_experts > 0;
  const int64_t Is = shared ? w.shared_gate.shape[0] : 0;

  // Everything that reads x, in one batch: the router logits (f32 over the full-width input,
  // x.float() @ W_r.float(), not rounded), the latent down projection and the shared MLP's
  // gate and up projections (bf16 nn.Linear outputs).
  float* logits = arena.take<float>(T * E);                  // [T, E]
  float* zl = latent ? arena.take<float>(T * r) : nullptr;   // [T, r]
  float* sg = shared ? arena.take<float>(T * Is) : nullptr;  // [T, Is]
  float* su = shared ? arena.take<float>(T * Is) : nullptr;  // [T, Is]
  {
    MatmulJob jobs[4];
    int n = 0;
    jobs[n++] = dense_job(x, T, w.gate, logits);
    if (latent) jobs[n++] = dense_job(x, T, w.latent_down, zl);
    if (shared) {
      jobs[n++] = dense_job(x, T, w.shared_gate, sg);
      jobs[n++] = dense_job(x, T, w.shared_up, su);
    }
    project_batch(pj, jobs, n, /*first_rounded=*/1);  // the router logits stay f32
  }
  int32_t* ids = arena.take<int32_t>(T * K);  // [T, K]
  float* wts = arena.take<float>(T * K);      // [T, K]
  RouterOptions ro;
  ro.top_k = K;
  ro.renormalize = c.moe_renormalize;
  ro.scaling = c.routed_scaling_factor;
  ro.bias_in_weights = opt.mis.router_bias_in_weights;
  float* router_scratch = arena.take<float>(T * E);
  route_sigmoid_topk(logits, w.gate_bias.data ? widen(w.gate_bias, arena) : nullptr, T, E, ro, ids,
                     wts, router_scratch);

  // Routed branch in the latent space, tokens in slices of at most kMoeTokenSlice (bounds the
  // scratch; every token's arithmetic is the same whatever the slicing).
  const float* z = latent ? zl : x;     // [T, r]
  float* y = arena.take<float>(T * r);  // [T, r] f32 accumulation of the weighted experts
  std::fill(y, y + T * r, 0.0f);
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
    // Token lists per expert (counting sort): each chosen expert runs once over its tokens.
    std::fill(count, count + E + 1, 0);
    for (int64_t i = 0; i < ts * K; ++i) ++count[ids[base + i] + 1];
    for (int64_t e = 0; e < E; ++e) count[e + 1] += count[e];
    std::copy(count, count + E, fill);
    for (int64_t i = 0; i < ts * K; ++i) slot_of[fill[ids[base + i]]++] = base + i;
    for (int64_t g = 0; g < ts * K; ++g) {
      const int64_t t = slot_of[g] / K;
      std::memcpy(zg + g * r, z + t * r, sizeof(float) * static_cast<size_t>(r));
    }
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
    gated_activation(c, h1, h3, ts * K * I, bf16, h1);
    nj = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t begin = count[e], n = count[e + 1] - begin;
      if (n == 0) continue;
      jobs[nj++] =
          expert_job(h1 + begin * I, n, w.experts[static_cast<size_t>(e)].w2, eo + begin * r);
    }
    project_batch(pj, jobs, nj);
    // Combine in expert index order (grouped order), which fixes every token's summation order.
    for (int64_t g = 0; g < ts * K; ++g) {
      const int64_t flat = slot_of[g], t = flat / K;
      const float wt = wts[flat];
      for (int64_t i = 0; i < r; ++i) y[t * r + i] += wt * eo[g * r + i];
    }
  }
  round_to_bf16(y, T * r, bf16);

  // Back to the model width and the shared MLP's down projection, in one batch.
  float* routed = y;                                        // [T, d]
  float* sh = shared ? arena.take<float>(T * d) : nullptr;  // [T, d]
  {
    MatmulJob last[2];
    int n = 0;
    if (latent) {
      if (w.latent_norm.data != nullptr) rms_norm(y, T, r, w.latent_norm, c.rms_norm_eps, bf16, y);
      routed = arena.take<float>(T * d);
      last[n++] = dense_job(y, T, w.latent_up, routed);
    }
    if (shared) {
      gated_activation(c, sg, su, T * Is, bf16, sg);
      last[n++] = dense_job(sg, T, w.shared_down, sh);
    }
    project_batch(pj, last, n);
  }
  if (shared) {
    for (int64_t i = 0; i < T * d; ++i) out[i] = routed[i] + sh[i];
  } else {
    std::memcpy(out, routed, sizeof(float) * static_cast<size_t>(T * d));
  }
  round_to_bf16(out, T * d, bf16);
}

void linear(const ForwardOptions& opt, Arena& arena, const float* x, int64_t T, const Matrix& W,
            float* y) {
  project(make_proj(opt, arena), x, T, W, y);
}

void dense_mlp_block(const ModelConfig& c, const DenseMlpWeights& w, const float* x, int64_t T,
                     const ForwardOptions& opt, Arena& arena, float* out) {
  const int64_t d = c.hidden_size;
  float* tmp = arena.take<float>(T * d);  // [T, d] so that out may alias x
  gated_mlp(c, w.gate, w.up, w.down, x, T, make_proj(opt, arena), tmp);
  std::memcpy(out, tmp, sizeof(float) * static_cast<size_t>(T * d));
}

}  // namespace attnres
