// Multi-head latent attention sublayer (k3-model.md §4: NoPE MLA with the sigmoid output gate)
// over the rows of one step; each segment attends over its own sequence's latent cache.
//
// Tensor parallelism: a rank computes its output rows of q_a and kv_a, and all ranks gather
// them (one fused gather: the latent norms need whole vectors, and the latent cache, shared by
// every head, is held whole by every rank); q_b, kv_b, the attention and the output gate run on
// the rank's heads; the heads' outputs are gathered, o_proj's output rows computed and gathered:
// 3 gathers per layer. The output gate's sigmoid runs while the latents are in flight.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "kernels/activation.h"
#include "kernels/mla.h"
#include "kernels/norm.h"
#include "kernels/parallel.h"
#include "model/blocks.h"
#include "model/projection.h"
#include "util/parallel.h"

namespace attnres {
namespace {

// H: this rank's heads.
MlaDims mla_dims(const ModelConfig& c, const TpStep& tp) {
  MlaDims md;
  md.H = tp.range(c.num_attention_heads).size();
  md.nope = c.qk_nope_head_dim;
  md.rope = c.qk_rope_head_dim;
  md.v = c.v_head_dim;
  md.r = c.kv_lora_rank;
  md.scale = 1.0f / std::sqrt(static_cast<float>(md.nope + md.rope));
  return md;
}

// Queries q [T, H, nope + rope], latents c_kv [T, r] (normalised) and k_rot [T, rope], and the
// output gate's logits [T, H*v] when the layer has one.
struct MlaRows {
  float* q;
  float* c_kv;
  float* k_rot;
  float* gate;
};

void project_inputs(const ModelConfig& c, const MlaWeights& w, const MlaDims& md, const Proj& pj,
                    const TpStep& tp, const float* x, int64_t T, const MlaRows& a) {
  const bool bf16 = pj.bf16;
  const float eps = ModelConfig::kMlaLatentNormEps;
  const int64_t kvw = md.r + md.rope, rq = c.q_lora_rank;
  float* cq = rq > 0 ? pj.arena.take<float>(T * rq) : nullptr;  // [T, r_q]
  float* kva = pj.arena.take<float>(T * kvw);                   // [T, r+rope]
  {
    // The projections of x at once (one parallel region): this rank's rows of q_a and kv_a
    // into its columns of cq and kva, its heads of q (without q_a) and of the gate.
    const Range qr = tp.range(rq), kr = tp.range(kvw);
    MatmulJob jobs[3] = {
        cq ? cols_job(x, T, w.q_a_proj, cq, qr.begin, rq) : dense_job(x, T, w.q_proj, a.q),
        cols_job(x, T, w.kv_a_proj, kva, kr.begin, kvw)};
    int n = 2;
    if (a.gate != nullptr) jobs[n++] = dense_job(x, T, w.g_proj, a.gate);
    project_batch(pj, jobs, n);
  }
  // The latents of every rank (one gather); the gate's sigmoid meanwhile.
  if (cq)
    tp.start({part(cq, T, rq, 1, bf16), part(kva, T, kvw, 1, bf16)});
  else
    tp.start({part(kva, T, kvw, 1, bf16)});
  if (a.gate != nullptr) {
    const int64_t n = T * md.H * md.v;
    parallel_ranges(n, n > kParallelMinWork, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) a.gate[i] = sigmoidf(a.gate[i]);
    });
  }
  tp.finish();
  if (cq) {
    rms_norm(cq, T, rq, w.q_a_norm, eps, bf16, cq);
    project(pj, cq, T, w.q_b_proj, a.q);
  }
  // [c_kv | k_rot] per token, then c_kv normalised; the cache gets the normalised latents.
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(a.c_kv + t * md.r, kva + t * kvw, sizeof(float) * static_cast<size_t>(md.r));
    std::memcpy(a.k_rot + t * md.rope, kva + t * kvw + md.r,
                sizeof(float) * static_cast<size_t>(md.rope));
  }
  rms_norm(a.c_kv, T, md.r, w.kv_a_norm, eps, bf16, a.c_kv);
}

MlaAbsorbedWeights absorbed_weights(const MlaWeights& w) {
  return {&w.kv_b_proj, w.w_uk_t.data(), w.w_uv.data()};
}

// The absorbed form (decode) over the cache as stored: bf16 and f32 pages are read in place,
// fp8 pages through a dequantised copy.
void attend_absorbed(const MlaWeights& w, const MlaDims& md, const SequenceCache& cache, int m,
                     const float* q, int64_t T, int64_t N, Arena& arena, float* o) {
  const int64_t pages = (N + cache.pool()->page_tokens() - 1) / cache.pool()->page_tokens();
  const auto run = [&](const auto& c_kv, const auto& k_rot, int64_t page_rows) {
    float* scratch = arena.take<float>(mla_absorbed_scratch_floats(md, N, T, page_rows));
    mla_attend_absorbed(md, q, T, c_kv, k_rot, absorbed_weights(w), o, scratch);
  };
  switch (cache.pool()->dtype()) {
    case KvCacheDtype::kBF16: {
      const bf16** cp = arena.take<const bf16*>(2 * pages);
      run(cache.c_kv_rows<bf16>(m, N, cp), cache.k_rot_rows<bf16>(m, N, cp + pages),
          cache.pool()->page_tokens());
      break;
    }
    case KvCacheDtype::kF32: {
      const float** cp = arena.take<const float*>(2 * pages);
      run(cache.c_kv_rows<float>(m, N, cp), cache.k_rot_rows<float>(m, N, cp + pages),
          cache.pool()->page_tokens());
      break;
    }
    default: {
      float* ctx_c = arena.take<float>(N * md.r);     // [N, r]
      float* ctx_k = arena.take<float>(N * md.rope);  // [N, rope]
      cache.read(m, N, ctx_c, ctx_k);
      const float* cp[1] = {ctx_c};
      const float* kp[1] = {ctx_k};
      run(PagedRows<float>{cp, N, md.r, N}, PagedRows<float>{kp, N, md.rope, N}, 0);
    }
  }
}

// The expanded form (prefill, the HF form): k_nope | v of every context token from kv_b_proj.
void attend_expanded(const MlaWeights& w, const MlaDims& md, const SequenceCache& cache, int m,
                     const Proj& pj, const float* q, int64_t T, int64_t N, float* o) {
  Arena& arena = pj.arena;
  float* ctx_c = arena.take<float>(N * md.r);     // [N, r]
  float* ctx_k = arena.take<float>(N * md.rope);  // [N, rope]
  cache.read(m, N, ctx_c, ctx_k);
  float* kv = arena.take<float>(N * md.H * (md.nope + md.v));  // [N, H, nope + v]
  project(pj, ctx_c, N, w.kv_b_proj, kv);
  float* scratch = arena.take<float>(mla_expanded_scratch_floats(N, T));
  mla_attend_expanded(md, q, T, kv, ctx_k, N, o, scratch);
}

// The single-token segments of the step, all in one absorbed pass (each over its own context:
// bf16 and f32 pages in place, fp8 through a dequantised copy), sharing one read of the
// absorbed weights.
void attend_decode_rows(const MlaWeights& w, const MlaDims& md, int layer, Segments segments,
                        const float* q, Arena& arena, float* o) {
  const int64_t qw = md.nope + md.rope, ow = md.H * md.v;
  int64_t n = 0;
  for (const Segment& s : segments) n += s.rows == 1 ? 1 : 0;
  if (n == 0) return;
  int64_t* contexts = arena.take<int64_t>(n);
  const Segment** rows = arena.take<const Segment*>(n);
  n = 0;
  for (const Segment& s : segments) {
    if (s.rows != 1) continue;
    rows[n] = &s;
    contexts[n++] = s.state->position + 1;
  }
  const KvPool& pool = *rows[0]->state->cache.pool();
  // fill(segment, mla layer index, context, row) sets the row's context; page_rows: the pages'
  // size (0: every context in one page).
  const auto run = [&](auto tag, int64_t page_rows, auto&& fill) {
    using C = decltype(tag);
    AbsorbedRow<C>* ar = arena.take<AbsorbedRow<C>>(n);
    for (int64_t i = 0; i < n; ++i) {
      const Segment& s = *rows[i];
      ar[i].q = q + s.row0 * md.H * qw;
      ar[i].o = o + s.row0 * ow;
      fill(s, s.state->mla_index[static_cast<size_t>(layer)], contexts[i], ar[i]);
    }
    float* scratch =
        arena.take<float>(mla_absorbed_rows_scratch_floats(md, contexts, n, page_rows));
    mla_attend_absorbed_rows(md, ar, n, absorbed_weights(w), scratch);
  };
  const auto in_place = [&](const Segment& s, int m, int64_t N, auto& row) {
    using C = std::remove_cv_t<
        std::remove_pointer_t<typename std::remove_reference_t<decltype(row)>::value_type>>;
    const int64_t pages = (N + pool.page_tokens() - 1) / pool.page_tokens();
    const C** cp = arena.take<const C*>(2 * pages);
    row.c_kv = s.state->cache.template c_kv_rows<C>(m, N, cp);
    row.k_rot = s.state->cache.template k_rot_rows<C>(m, N, cp + pages);
  };
  switch (pool.dtype()) {
    case KvCacheDtype::kBF16:
      run(bf16{}, pool.page_tokens(), in_place);
      break;
    case KvCacheDtype::kF32:
      run(float{}, pool.page_tokens(), in_place);
      break;
    default:
      run(float{}, 0, [&](const Segment& s, int m, int64_t N, AbsorbedRow<float>& row) {
        float* c = arena.take<float>(N * md.r);     // [N, r]
        float* k = arena.take<float>(N * md.rope);  // [N, rope]
        s.state->cache.read(m, N, c, k);
        const float** cp = arena.take<const float*>(2);
        cp[0] = c;
        cp[1] = k;
        row.c_kv = PagedRows<float>{cp, N, md.r, N};
        row.k_rot = PagedRows<float>{cp + 1, N, md.rope, N};
      });
  }
}

}  // namespace

void mla_block(const ModelConfig& c, const MlaWeights& w, int layer, Segments segments,
               const float* x, const bf16* xh, int64_t T, const ForwardOptions& opt, Arena& arena,
               float* out) {
  const Proj pj = make_proj(opt, arena, x, xh);
  const TpStep tp = tp_step(opt);
  const bool bf16 = opt.bf16();
  const MlaDims md = mla_dims(c, tp);
  const int64_t qw = md.nope + md.rope, ow = md.H * md.v, d = c.hidden_size;
  MlaRows a;
  a.q = arena.take<float>(T * md.H * qw);
  a.c_kv = arena.take<float>(T * md.r);
  a.k_rot = arena.take<float>(T * md.rope);
  a.gate = w.g_proj.data != nullptr ? arena.take<float>(T * ow) : nullptr;  // then its sigmoid
  project_inputs(c, w, md, pj, tp, x, T, a);

  // Every segment's latents into its sequence's cache; then each attends over its whole context
  // as stored (dequantised), so one-shot and chunked prefill and decode all attend to the same
  // values. Single-token segments (decode) run together in the absorbed form, sharing one pass
  // over kv_b_proj; longer ones each in the expanded form.
  float* o = arena.take<float>(T * ow);  // [T, H, v]
  for (const Segment& s : segments) {
    const int m = s.state->mla_index[static_cast<size_t>(layer)];
    s.state->cache.write(m, s.state->position, a.c_kv + s.row0 * md.r, a.k_rot + s.row0 * md.rope,
                         s.rows);
  }
  attend_decode_rows(w, md, layer, segments, a.q, arena, o);
  for (const Segment& s : segments) {
    if (s.rows == 1) continue;
    const SequenceCache& cache = s.state->cache;
    const int m = s.state->mla_index[static_cast<size_t>(layer)];
    const int64_t N = s.state->position + s.rows;
    const float* q = a.q + s.row0 * md.H * qw;
    float* os = o + s.row0 * ow;
    if (opt.mla_absorbed)
      attend_absorbed(w, md, cache, m, q, s.rows, N, arena, os);
    else
      attend_expanded(w, md, cache, m, pj, q, s.rows, N, os);
  }
  round_to_bf16(o, T * ow, bf16);
  if (a.gate != nullptr) {
    for (int64_t i = 0; i < T * ow; ++i) o[i] *= a.gate[i];
    round_to_bf16(o, T * ow, bf16);
  }
  if (!tp.sharded()) {
    project(pj, o, T, w.o_proj, out);
    return;
  }
  const int64_t Hall = c.num_attention_heads;
  float* oall = arena.take<float>(T * Hall * md.v);  // [T, H_all, v]
  tp.gather({part_from(o, oall, T, Hall, md.v, bf16)});
  const Range rows = tp.range(d);
  MatmulJob j = cols_job(oall, T, w.o_proj, out, rows.begin, d);
  project_batch(pj, &j, 1);
  tp.gather({part(out, T, d, 1, bf16)});
}

}  // namespace attnres
