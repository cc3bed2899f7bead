// Feed-forward sublayers (k3-model.md §5): the latent MoE (sigmoid router with selection bias,
// routed experts in a latent space, shared experts) and the dense SiTU MLP of layer 0.
//
// Every token's arithmetic depends only on that token: its experts run on its own row (the
// expert products are row-invariant, matmul.h) and its weighted expert outputs are summed in
// expert index order, whichever other tokens share the step.
//
// Tensor parallelism (parallel.md): a rank computes its rows of the router (expert scores) and
// of the latent down projection (one fused gather; every rank then selects the same top-k from
// the whole score vector), its rows of every selected expert's w1/w3 (the intermediate
// dimension; gathered together with its share of the shared experts' intermediate) and of w2
// (the latent dimension), so each rank reads 1/P of every selected expert whatever the routing;
// it sums its latent elements of the weighted expert outputs in the single process's order,
// gathers the latent aggregate (the shared experts' down projection runs meanwhile), computes
// its output rows of the latent up projection and adds the shared experts' rows; the sum is
// gathered: 4 gathers per layer. The dense MLP: gate/up rows, gathered, down rows, gathered.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "kernels/moe_combine.h"
#include "kernels/norm.h"
#include "kernels/parallel.h"
#include "kernels/router.h"
#include "model/blocks.h"
#include "model/projection.h"
#include "util/parallel.h"

namespace attnres {
namespace {

// Routed experts run over slices of at most this many tokens (scratch ~ slice * top_k rows).
constexpr int64_t kMoeTokenSlice = 512;

struct MoeDims {
  int64_t d, E, K, I, r, Is_all;  // Is_all: the shared experts' intermediate, every rank's
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
  m.Is_all = m.shared ? int64_t{c.num_shared_experts} * c.moe_intermediate_size : 0;
  (void)w;
  return m;
}

// This rank's share of the expert dimensions (everything with one rank).
struct ExpertShare {
  int64_t I;  // rows of w1 / w3 (intermediate)
  Range r;    // rows of w2 (latent or model dimension): its columns of y
};

// Whether an expert matrix runs on bf16 tokens alone (MatmulJob::xh without x) in the vdpbf16ps
// flow: MXFP4 or BF16 weights (F32 weights read f32 tokens).
bool reads_bf16_tokens(const ExpertMatrix& m) {
  return m.mxfp4 || m.dense.dtype == DType::kBF16;
}

// y [T, r] += sum over each token's chosen experts of weight * expert(z), f32, in slices of
// kMoeTokenSlice tokens; within a slice the (token, choice) pairs are grouped by expert so
// each chosen expert's matrices are read once, and summed back in that (expert index) order.
// Sharded: this rank's columns of y only. `extra` (the shared experts' intermediate, may be
// empty) travels with the first slice's gather of the expert intermediates.
void routed_experts(const ModelConfig& c, const MoeWeights& w, const MoeDims& m, const Proj& pj,
                    const TpStep& tp, const ExpertShare& es, const float* z, const int32_t* ids,
                    const float* wts, int64_t T, const GatherPart& extra, float* y) {
  Arena& arena = pj.arena;
  const int64_t E = m.E, K = m.K, I = m.I, r = m.r, Il = es.I, rl = es.r.size();
  const int64_t S = std::min<int64_t>(T, kMoeTokenSlice);
  int64_t* count = arena.take<int64_t>(E + 1);
  int64_t* fill = arena.take<int64_t>(E);
  int64_t* slot_of = arena.take<int64_t>(S * K);  // grouped position -> flat (t * K + s)
  int64_t* pos_of = arena.take<int64_t>(S * K);   // flat - base -> grouped position
  float* zg = arena.take<float>(S * K * r);       // [S*K, r] gathered inputs, grouped by expert
  // In the vdpbf16ps flow, where a slice's chosen experts read bf16 tokens alone, their inputs
  // are gathered as bf16 (zgh): half the bytes of the f32 gather, and no bf16 copy of them before
  // w1/w3. The copy checks that each row is bf16 values (the latents are rounded projection
  // outputs); a slice with a row that is not takes the f32 gather, and project_batch's checked
  // copy. Likewise w2's input: the activation stored as bf16 (hh), unless it is gathered from
  // every rank first (sharded: hall, f32).
  bf16* zgh = pj.dot ? arena.take<bf16>(S * K * r) : nullptr;
  bf16* hh = pj.dot && !tp.sharded() ? arena.take<bf16>(S * K * I) : nullptr;
  float* h1 = arena.take<float>(S * K * Il);                       // [S*K, I] (this rank's I)
  float* h3 = arena.take<float>(S * K * Il);                       // [S*K, I]
  float* hall = tp.sharded() ? arena.take<float>(S * K * I) : h1;  // [S*K, I] every rank's
  float* eo = arena.take<float>(S * K * rl);                       // [S*K, r] (this rank's r)
  float* wg = arena.take<float>(S * K);  // [S, K] combine weights in each token's slot order
  MatmulJob* jobs = arena.take<MatmulJob>(2 * std::min(E, S * K));
  bool extra_sent = extra.full == nullptr;
  for (int64_t t0 = 0; t0 < T; t0 += S) {
    const int64_t ts = std::min(S, T - t0), base = t0 * K;
    // Token lists per expert (counting sort).
    std::fill(count, count + E + 1, 0);
    for (int64_t i = 0; i < ts * K; ++i) ++count[ids[base + i] + 1];
    for (int64_t e = 0; e < E; ++e) count[e + 1] += count[e];
    std::copy(count, count + E, fill);
    for (int64_t i = 0; i < ts * K; ++i) {
      pos_of[i] = fill[ids[base + i]]++;
      slot_of[pos_of[i]] = base + i;
    }
    // w1 and w3 of every chosen expert in one batch, then w2 of every chosen expert. The chosen
    // experts' formats decide the gathers' dtypes (read here, where the jobs read them anyway: a
    // scan of every expert's weights at each step cost more than the copies it saved at decode).
    int64_t nj = 0;
    bool bf16_rows = zgh != nullptr, mid_bf16 = hh != nullptr;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t begin = count[e], n = count[e + 1] - begin;
      if (n == 0) continue;
      const ExpertWeights& ew = w.experts[static_cast<size_t>(e)];
      jobs[nj++] = expert_job(zg + begin * r, n, ew.w1, h1 + begin * Il);
      jobs[nj++] = expert_job(zg + begin * r, n, ew.w3, h3 + begin * Il);
      bf16_rows = bf16_rows && reads_bf16_tokens(ew.w1) && reads_bf16_tokens(ew.w3);
      mid_bf16 = mid_bf16 && reads_bf16_tokens(ew.w2);
    }
    if (bf16_rows) {
      std::atomic<bool> exact{true};
      parallel_ranges(ts * K, ts * K * r > kParallelMinWork, [&](int64_t g0, int64_t g1) {
        for (int64_t g = g0; g < g1; ++g)
          if (!bf16_exact_copy(z + slot_of[g] / K * r, r, zgh + g * r))
            exact.store(false, std::memory_order_relaxed);
      });
      bf16_rows = exact.load();
    }
    if (!bf16_rows) {
      parallel_ranges(ts * K, ts * K * r > kParallelMinWork, [&](int64_t g0, int64_t g1) {
        for (int64_t g = g0; g < g1; ++g)
          std::memcpy(zg + g * r, z + slot_of[g] / K * r, sizeof(float) * static_cast<size_t>(r));
      });
    } else {
      for (int64_t i = 0; i < nj; ++i) {  // the same rows of the bf16 gather
        jobs[i].xh = zgh + (jobs[i].x - zg);
        jobs[i].x = nullptr;
      }
    }
    project_batch(pj, jobs, nj);
    if (mid_bf16)
      gated_activation(c, h1, h3, ts * K * Il, hh);
    else
      gated_activation(c, h1, h3, ts * K * Il, pj.bf16, h1);
    if (tp.sharded()) {
      const GatherPart hp = part_from(h1, hall, ts * K, I, 1, pj.bf16);
      if (!extra_sent)
        tp.gather({hp, extra});
      else
        tp.gather({hp});
    } else if (!extra_sent) {
      tp.gather({extra});
    }
    extra_sent = true;
    nj = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t begin = count[e], n = count[e + 1] - begin;
      if (n == 0) continue;
      jobs[nj++] =
          expert_job(hall + begin * I, n, w.experts[static_cast<size_t>(e)].w2, eo + begin * rl);
      if (mid_bf16) {
        jobs[nj - 1].x = nullptr;
        jobs[nj - 1].xh = hh + begin * I;
      }
    }
    project_batch(pj, jobs, nj);
    // Each token's weighted expert outputs, added in grouped (expert index) order: its grouped
    // positions sorted ascending, their weights gathered in that order.
    for (int64_t t = 0; t < ts; ++t) std::sort(pos_of + t * K, pos_of + (t + 1) * K);
    parallel_ranges(ts, ts * K * rl > kParallelMinWork, [&](int64_t t_begin, int64_t t_end) {
      for (int64_t t = t_begin; t < t_end; ++t) {
        const int64_t* g = pos_of + t * K;
        float* wt = wg + t * K;
        for (int64_t s = 0; s < K; ++s) wt[s] = wts[slot_of[g[s]]];
        moe_combine(eo, rl, g, wt, K, rl, y + (t0 + t) * r + es.r.begin);
      }
    });
  }
  if (!extra_sent) tp.gather({extra});
}

}  // namespace

void moe_block(const ModelConfig& c, const MoeWeights& w, const float* x, const bf16* xh, int64_t T,
               const ForwardOptions& opt, Arena& arena, float* out) {
  const Proj pj = make_proj(opt, arena, x, xh);
  const TpStep tp = tp_step(opt);
  const bool bf16 = opt.bf16();
  const MoeDims m = moe_dims(c, w);
  const int64_t d = m.d, Isl = m.shared ? w.shared_gate.shape[0] : 0;  // this rank's Is
  const Range er = tp.range(m.E), rr = tp.range(m.r), dr = tp.range(d);
  float* logits = arena.take<float>(T * m.E);                   // [T, E]
  float* zl = m.latent ? arena.take<float>(T * m.r) : nullptr;  // [T, r]
  float* sg = m.shared ? arena.take<float>(T * Isl) : nullptr;  // [T, Is] (this rank's)
  float* su = m.shared ? arena.take<float>(T * Isl) : nullptr;  // [T, Is]
  {
    // Everything that reads x, in one batch: the router logits (f32 over the full-width input,
    // x.float() @ W_r.float(), not rounded), the latent down projection and the shared MLP's
    // gate and up projections (bf16 nn.Linear outputs); this rank's rows of each.
    MatmulJob jobs[4];
    int n = 0;
    jobs[n++] = cols_job(x, T, w.gate, logits, er.begin, m.E);
    if (m.latent) jobs[n++] = cols_job(x, T, w.latent_down, zl, rr.begin, m.r);
    if (m.shared) {
      jobs[n++] = dense_job(x, T, w.shared_gate, sg);
      jobs[n++] = dense_job(x, T, w.shared_up, su);
    }
    project_batch(pj, jobs, n, /*first_rounded=*/1);  // the router logits stay f32
  }
  // Every rank's scores and latents (one gather); the shared MLP's activation meanwhile.
  if (m.latent)
    tp.start({part(logits, T, m.E, 1, false), part(zl, T, m.r, 1, bf16)});
  else
    tp.start({part(logits, T, m.E, 1, false)});
  if (m.shared) gated_activation(c, sg, su, T * Isl, bf16, sg);
  tp.finish();

  // Router: top-k experts per token and their combine weights (the same on every rank).
  int32_t* ids = arena.take<int32_t>(T * m.K);  // [T, K]
  float* wts = arena.take<float>(T * m.K);      // [T, K]
  RouterOptions ro;
  ro.top_k = m.K;
  ro.renormalize = c.moe_renormalize;
  ro.scaling = c.routed_scaling_factor;
  ro.bias_in_weights = w.combine_with_bias;
  route_sigmoid_topk(logits, w.gate_bias.data ? widen(w.gate_bias, arena) : nullptr, T, m.E, ro,
                     ids, wts, arena.take<float>(T * m.E));

  // The shared MLP's intermediate of every rank (gathered with the experts' first slice).
  const int64_t Is = m.Is_all;
  float* sga = m.shared && tp.sharded() ? arena.take<float>(T * Is) : sg;  // [T, Is] all ranks'
  GatherPart extra;
  if (m.shared && tp.sharded()) extra = part_from(sg, sga, T, Is, 1, bf16);

  // Routed branch in the latent space (f32 accumulation, then a bf16 value): this rank's
  // columns of y.
  float* y = arena.take<float>(T * m.r);  // [T, r]
  std::fill(y, y + T * m.r, 0.0f);
  const ExpertShare es{tp.range(m.I).size(), rr};
  routed_experts(c, w, m, pj, tp, es, m.latent ? zl : x, ids, wts, T, extra, y);
  round_to_bf16(y, T * m.r, bf16);

  // Back to the model width and the shared MLP's down projection: this rank's output rows.
  float* sh = m.shared ? arena.take<float>(T * d) : nullptr;  // [T, d]
  MatmulJob shared_down;
  if (m.shared) shared_down = cols_job(sga, T, w.shared_down, sh, dr.begin, d);
  float* routed = y;  // [T, d] without a latent space
  if (m.latent && !tp.sharded()) {
    // One rank: the up and shared down projections in one batch.
    if (w.latent_norm.data != nullptr) rms_norm(y, T, m.r, w.latent_norm, c.rms_norm_eps, bf16, y);
    routed = arena.take<float>(T * d);
    MatmulJob last[2] = {cols_job(y, T, w.latent_up, routed, 0, d), shared_down};
    project_batch(pj, last, m.shared ? 2 : 1);
  } else if (m.latent) {
    // The aggregate of every rank (the shared down projection meanwhile), its norm, then this
    // rank's rows of the up projection.
    tp.start({part(y, T, m.r, 1, bf16)});
    if (m.shared) project_batch(pj, &shared_down, 1);
    tp.finish();
    if (w.latent_norm.data != nullptr) rms_norm(y, T, m.r, w.latent_norm, c.rms_norm_eps, bf16, y);
    routed = arena.take<float>(T * d);
    MatmulJob up = cols_job(y, T, w.latent_up, routed, dr.begin, d);
    project_batch(pj, &up, 1);
  } else if (m.shared) {
    project_batch(pj, &shared_down, 1);
  }
  // out = routed + shared on this rank's columns, then every rank's columns.
  parallel_ranges(T, T * dr.size() > kParallelMinWork, [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      float* o = out + t * d;
      const float* ro_t = routed + t * d;
      if (m.shared) {
        const float* s_t = sh + t * d;
        for (int64_t i = dr.begin; i < dr.end; ++i) o[i] = ro_t[i] + s_t[i];
      } else {
        std::memcpy(o + dr.begin, ro_t + dr.begin, sizeof(float) * static_cast<size_t>(dr.size()));
      }
      round_to_bf16(o + dr.begin, dr.size(), bf16);
    }
  });
  tp.gather({part(out, T, d, 1, bf16)});
}

void linear(const ForwardOptions& opt, Arena& arena, const float* x, int64_t T, const Matrix& W,
            float* y) {
  project(make_proj(opt, arena), x, T, W, y);
}

void dense_mlp_block(const ModelConfig& c, const DenseMlpWeights& w, const float* x, const bf16* xh,
                     int64_t T, const ForwardOptions& opt, Arena& arena, float* out) {
  const Proj pj = make_proj(opt, arena, x, xh);
  const TpStep tp = tp_step(opt);
  const int64_t Il = w.gate.shape[0], I = c.intermediate_size, d = c.hidden_size;
  float* g = arena.take<float>(T * Il);                     // [T, I] (this rank's)
  float* u = arena.take<float>(T * Il);                     // [T, I]
  float* ga = tp.sharded() ? arena.take<float>(T * I) : g;  // [T, I] every rank's
  float* tmp = arena.take<float>(T * d);                    // [T, d] so that out may alias x
  MatmulJob jobs[2] = {dense_job(x, T, w.gate, g), dense_job(x, T, w.up, u)};
  project_batch(pj, jobs, 2);
  gated_activation(c, g, u, T * Il, pj.bf16, g);
  if (tp.sharded()) tp.gather({part_from(g, ga, T, I, 1, pj.bf16)});
  const Range dr = tp.range(d);
  MatmulJob down = cols_job(ga, T, w.down, tmp, dr.begin, d);
  project_batch(pj, &down, 1);
  tp.gather({part(tmp, T, d, 1, pj.bf16)});
  std::memcpy(out, tmp, sizeof(float) * static_cast<size_t>(T * d));
}

}  // namespace attnres
