// Kimi Delta Attention sublayer (k3-model.md §3; fla's KimiDeltaAttention with
// use_qk_l2norm_in_kernel and the lower-bound gate) over the rows of one step.
//
// Tensor parallelism: a rank runs everything per head (projections, convolutions, gate,
// recurrence, output norm and gate) on its own heads against its own heads' states, gathers the
// heads' outputs, computes its output rows of o_proj and gathers them: 2 gathers per layer.
// Every per-head kernel computes a head from that head's inputs alone, so the heads a rank
// computes are bitwise the single process's.
#include <algorithm>
#include <cmath>

#include "kernels/activation.h"
#include "kernels/kda.h"
#include "kernels/norm.h"
#include "model/blocks.h"
#include "model/projection.h"
#include "util/parallel.h"

namespace attnres {
namespace {

// Per-row activations of the sublayer, every row of the step; H = this rank's heads.
struct KdaRows {
  float* q;     // [T, H, dk]
  float* k;     // [T, H, dk]
  float* v;     // [T, H, dv]
  float* fa;    // [T, dk] f_a_proj x, then the forget gate's low-rank input
  float* beta;  // [T, H] b_proj x, then sigmoid
  float* gate;  // [T, H*dv] output gate (g_proj x, or g_b_proj g_a_proj x)
  float* ga;    // [T, dv] g_a_proj x (low-rank gate only)
  float* g;     // [T, H, dk] log decay
  float* o;     // [T, H, dv]
};

// This rank's heads and channels (all of them with one rank).
struct KdaShare {
  int64_t H, P;  // heads, channels (H * head_dim)
};

// Every projection of x at once (one parallel region); each is rounded like a bf16 nn.Linear
// output (beta too: b_proj's output is bf16, the sigmoid is f32).
void project_inputs(const ModelConfig& c, const KdaWeights& w, const Proj& pj, const float* x,
                    int64_t T, const KdaRows& a) {
  MatmulJob jobs[6] = {dense_job(x, T, w.q_proj, a.q),
                       dense_job(x, T, w.k_proj, a.k),
                       dense_job(x, T, w.v_proj, a.v),
                       dense_job(x, T, w.f_a_proj, a.fa),
                       dense_job(x, T, w.b_proj, a.beta),
                       c.linear.use_full_rank_gate ? dense_job(x, T, w.g_proj, a.gate)
                                                   : dense_job(x, T, w.g_a_proj, a.ga)};
  project_batch(pj, jobs, 6);
}

// The short causal convolutions (+ SiLU) per segment, each over its sequence's conv window, and
// the second projections of the first batch's low-rank outputs (the forget gate's f_b_proj, and
// g_b_proj for a low-rank output gate): independent work. When no segment's convolutions split
// over the threads (a decode step's are too small to), one thread runs them while the others
// share the projections' rows, and joins them when done; otherwise one after the other, each
// over every thread.
void convolve_and_project(const ModelConfig& c, const KdaWeights& w, int layer, Segments segments,
                          const KdaShare& sh, const Proj& pj, int64_t T, const KdaRows& a) {
  const int64_t P = sh.P, Pv = sh.P;
  const int W = c.linear.short_conv_kernel_size;
  const float* wq = widen(w.q_conv, pj.arena);
  const float* wk = widen(w.k_conv, pj.arena);
  const float* wv = widen(w.v_conv, pj.arena);
  MatmulJob jobs[2] = {dense_job(a.fa, T, w.f_b_proj, a.g)};
  int n = 1;
  if (!c.linear.use_full_rank_gate) jobs[n++] = dense_job(a.ga, T, w.g_b_proj, a.gate);
  const auto convolve = [&] {
    for (const Segment& s : segments) {
      KdaState& st = s.state->kda[static_cast<size_t>(layer)];
      float* q = a.q + s.row0 * P;
      float* k = a.k + s.row0 * P;
      float* v = a.v + s.row0 * Pv;
      causal_conv1d_silu(q, s.rows, P, wq, W, st.conv_q.data(), q);
      causal_conv1d_silu(k, s.rows, P, wk, W, st.conv_k.data(), k);
      causal_conv1d_silu(v, s.rows, Pv, wv, W, st.conv_v.data(), v);
    }
  };
  bool splits = false;
  for (const Segment& s : segments) splits = splits || causal_conv1d_silu_splits(s.rows, P, W);
  if (splits) {
    convolve();
    project_batch(pj, jobs, n);
    return;
  }
  project_batch_beside(pj, jobs, n, convolve);
}

// The gated delta rule per segment against its recurrent state: the recurrent form for one
// token (decode) or when forced, the chunked WY form for a longer segment.
void delta_rule(const ModelConfig& c, int layer, Segments segments, const KdaShare& sh,
                const ForwardOptions& opt, Arena& arena, const KdaRows& a) {
  const int64_t H = sh.H, dk = c.linear.head_dim, dv = dk;
  const int64_t chunk = std::max<int64_t>(1, opt.kda_chunk);
  float* scratch = nullptr;
  for (const Segment& s : segments) {
    float* state = s.state->kda[static_cast<size_t>(layer)].recurrent.data();
    const int64_t r = s.row0;
    const float *q = a.q + r * H * dk, *k = a.k + r * H * dk, *v = a.v + r * H * dv;
    const float *g = a.g + r * H * dk, *beta = a.beta + r * H;
    float* o = a.o + r * H * dv;
    if (s.rows == 1 || opt.kda_recurrent) {
      kda_recurrent(q, k, v, g, beta, s.rows, H, dk, dv, state, o);
    } else {
      if (scratch == nullptr)
        scratch = arena.take<float>(kda_chunk_scratch_floats(H, chunk, dk, dv));
      kda_chunked(q, k, v, g, beta, s.rows, H, dk, dv, chunk, state, o, scratch);
    }
  }
}

}  // namespace

void kda_block(const ModelConfig& c, const KdaWeights& w, int layer, Segments segments,
               const float* x, const bf16* xh, int64_t T, const ForwardOptions& opt, Arena& arena,
               float* out) {
  const Proj pj = make_proj(opt, arena, x, xh);
  const TpStep tp = tp_step(opt);
  const bool bf16 = opt.bf16();
  const int64_t Hall = c.linear.num_heads, dk = c.linear.head_dim, dv = dk, d = c.hidden_size;
  const int64_t H = tp.range(Hall).size(), P = H * dk;
  const KdaShare sh{H, P};
  KdaRows a;
  a.q = arena.take<float>(T * P);
  a.k = arena.take<float>(T * P);
  a.v = arena.take<float>(T * H * dv);
  a.fa = arena.take<float>(T * dk);
  a.beta = arena.take<float>(T * H);
  a.gate = arena.take<float>(T * H * dv);
  a.ga = c.linear.use_full_rank_gate ? nullptr : arena.take<float>(T * dv);
  a.g = arena.take<float>(T * P);
  a.o = arena.take<float>(T * H * dv);

  project_inputs(c, w, pj, x, T, a);
  convolve_and_project(c, w, layer, segments, sh, pj, T, a);
  round_to_bf16(a.q, T * P, bf16);
  round_to_bf16(a.k, T * P, bf16);
  round_to_bf16(a.v, T * H * dv, bf16);
  // fla's use_qk_l2norm_in_kernel: f32 L2 norm per head, q scaled by dk^-1/2.
  l2_norm(a.q, T * H, dk, ModelConfig::kKdaL2NormEps, 1.0f / std::sqrt(static_cast<float>(dk)),
          a.q);
  l2_norm(a.k, T * H, dk, ModelConfig::kKdaL2NormEps, 1.0f, a.k);

  // Forget gate g [T, H, dk] (log decay, f32) over f_b_proj's output: one a_log entry per group
  // of a_log_group channels (a head).
  kda_gate(a.g, T, P / w.a_log_group, w.a_log_group, w.a_log.data(), widen(w.dt_bias, arena),
           c.linear.gate_lower_bound, a.g);
  for (int64_t i = 0; i < T * H; ++i) a.beta[i] = sigmoidf(a.beta[i]);

  delta_rule(c, layer, segments, sh, opt, arena, a);
  round_to_bf16(a.o, T * H * dv, bf16);

  // Output: gated RMSNorm per head, then the heads of every rank, then o_proj.
  gated_rms_norm(a.o, a.gate, T * H, dv, w.o_norm, c.rms_norm_eps, bf16, a.o);
  if (!tp.sharded()) {
    project(pj, a.o, T, w.o_proj, out);
    return;
  }
  float* o = arena.take<float>(T * Hall * dv);  // [T, H_all, dv]
  tp.gather({part_from(a.o, o, T, Hall, dv, bf16)});
  const Range rows = tp.range(d);
  MatmulJob j = cols_job(o, T, w.o_proj, out, rows.begin, d);
  project_batch(pj, &j, 1);
  tp.gather({part(out, T, d, 1, bf16)});
}

}  // namespace attnres
