#include "model/planned.h"

#include <cstring>

#include "kernels/parallel.h"
#include "parallel/gather.h"
#include "util/parallel.h"

namespace attnres {
namespace {

// Both conversions are elementwise, so a prefill's [T, d] rows are split over the threads.
void widen_rows(const ActView& v, float* out) {
  const int64_t n = v.numel();
  parallel_ranges(n, n > kParallelMinWork, [&](int64_t i0, int64_t i1) {
    if (v.dtype == ActDType::kF32) {
      std::memcpy(out + i0, v.f32_data() + i0, sizeof(float) * static_cast<size_t>(i1 - i0));
    } else {
      const bf16* src = v.bf16_data();
      for (int64_t i = i0; i < i1; ++i) out[i] = bf16_to_f32(src[i]);
    }
  });
}

// f32 rows into bf16 storage. The bf16 flow has already rounded the values, so this is exact.
void narrow_rows(const float* x, const ActView& v) {
  bf16* dst = v.bf16_data();
  parallel_ranges(v.numel(), v.numel() > kParallelMinWork, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) dst[i] = f32_to_bf16(x[i]);
  });
}

}  // namespace

template <typename Fn>
Status ExecutorRunner::run_sublayer(const ActView& in, const ActView& out, Fn fn) {
  Arena& arena = sub_.arena();
  arena.reset();  // the previous sublayer's scratch is dead
  if (in.tokens != sub_.tokens() || out.tokens != sub_.tokens()) {
    return Status(ErrorCode::kInternal, "executor runner: step of " + std::to_string(in.tokens) +
                                            " tokens, sublayers set up for " +
                                            std::to_string(sub_.tokens()));
  }
  if (in.dtype == ActDType::kF32) {
    fn(in.f32_data(), nullptr, out.f32_data());  // sublayers are exact when out aliases in
    return Status::ok();
  }
  float* x = arena.take<float>(in.numel());  // [T, d]
  widen_rows(in, x);
  fn(x, in.bf16_data(), x);  // in's storage is not written before narrow_rows
  narrow_rows(x, out);
  return Status::ok();
}

Status ExecutorRunner::embed(std::span<const int32_t> tokens, const ActView& out) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  if (out.dtype == ActDType::kF32)
    return embed_tokens(sub_.weights(), tokens.data(), T, out.f32_data());
  Arena& arena = sub_.arena();
  arena.reset();
  float* x = arena.take<float>(out.numel());
  ATTNRES_RETURN_IF_ERROR(embed_tokens(sub_.weights(), tokens.data(), T, x));
  for (int64_t i = 0; i < out.numel(); ++i) out.bf16_data()[i] = f32_to_bf16(x[i]);
  return Status::ok();
}

Status ExecutorRunner::attention(int layer, const ActView& in, const ActView& out) {
  return run_sublayer(
      in, out, [&](const float* x, const bf16* xh, float* y) { sub_.attention(layer, x, xh, y); });
}

Status ExecutorRunner::mlp(int layer, const ActView& in, const ActView& out) {
  return run_sublayer(in, out,
                      [&](const float* x, const bf16* xh, float* y) { sub_.mlp(layer, x, xh, y); });
}

Result<std::unique_ptr<PlannedForward>> PlannedForward::create(const ModelWeights& w,
                                                               ActDType dtype, int64_t max_tokens,
                                                               Policy policy, ReadKernel kernel) {
  const ModelConfig& c = w.config;
  std::unique_ptr<PlannedForward> pf(new PlannedForward(w));
  auto widen = [&](const TensorView& t) {
    std::vector<float> g(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) g[static_cast<size_t>(i)] = t.get_f32(i);
    pf->gains_.push_back(std::move(g));
    return std::span<const float>(pf->gains_.back());
  };
  pf->gains_.reserve(2 * w.layers.size() + 1);  // spans into gains_ must stay valid
  ForwardParams& p = pf->params_;
  p.res_eps = c.rms_norm_eps;
  p.norm_eps = c.rms_norm_eps;
  const bool ar = c.schedule.has_attnres();
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& lw = w.layers[i];
    LayerResParams lp;
    if (ar && i > 0) lp.attn_query = lw.attn_res_query;
    if (ar) lp.mlp_query = lw.mlp_res_query;
    lp.input_layernorm = widen(lw.input_norm);
    lp.post_attention_layernorm = widen(lw.post_attn_norm);
    p.layers.push_back(lp);
  }
  if (ar) p.output_query = w.out_res_query;
  p.final_norm = widen(w.final_norm);

  ExecutorOptions eo;
  eo.dtype = dtype;
  eo.max_tokens = max_tokens;
  eo.dim = c.hidden_size;
  eo.kernel = kernel;
  Program program = build_program(c.schedule);
  Plan plan = make_plan(program, policy);
  ATTNRES_ASSIGN_OR_RETURN(pf->executor_,
                           Executor::create(std::move(program), std::move(plan), eo));
  return pf;
}

namespace {

Status check_segments(Segments segments, int64_t T, int64_t max_tokens) {
  int64_t row = 0;
  for (const Segment& s : segments) {
    if (s.state == nullptr || s.rows <= 0 || s.row0 != row)
      return Status(ErrorCode::kInvalidArgument,
                    "forward step: segment at row " + std::to_string(s.row0) + " with " +
                        std::to_string(s.rows) + " rows does not continue the step at row " +
                        std::to_string(row));
    row += s.rows;
  }
  if (row != T || T <= 0 || T > max_tokens)
    return Status(ErrorCode::kInvalidArgument,
                  "forward step: segments cover " + std::to_string(row) + " rows of a step of " +
                      std::to_string(T) + " tokens (at most " + std::to_string(max_tokens) + ")");
  return Status::ok();
}

}  // namespace

Status PlannedForward::run(Segments segments, const ForwardOptions& opt, Arena& arena,
                           const int32_t* tokens, std::span<const int64_t> logit_rows,
                           float* logits) {
  if (opt.act != executor_->options().dtype) {
    return Status(ErrorCode::kInvalidArgument,
                  "planned forward: activation dtype " + std::string(act_dtype_name(opt.act)) +
                      " but the executor was built for " +
                      std::string(act_dtype_name(executor_->options().dtype)));
  }
  const Shard tp_shard = opt.tp ? opt.tp->shard() : Shard{};
  if (tp_shard.rank != w_.shard.rank || tp_shard.ranks != w_.shard.ranks)
    return Status(ErrorCode::kInvalidArgument,
                  "planned forward: weights bound for rank " + std::to_string(w_.shard.rank) +
                      " of " + std::to_string(w_.shard.ranks) + " but the step runs as rank " +
                      std::to_string(tp_shard.rank) + " of " + std::to_string(tp_shard.ranks));
  const int64_t T = segments.empty() ? 0 : segments.back().row0 + segments.back().rows;
  ATTNRES_RETURN_IF_ERROR(check_segments(segments, T, max_tokens()));
  ModelSublayers sub(w_, segments, opt, arena, T);
  ExecutorRunner runner(sub);
  ATTNRES_RETURN_IF_ERROR(
      executor_->run(runner, params_, std::span<const int32_t>(tokens, static_cast<size_t>(T))));
  advance_segments(segments);
  // lm_head over the requested rows of the final normalised hidden state.
  const int64_t n = static_cast<int64_t>(logit_rows.size()), d = w_.config.hidden_size;
  if (n == 0) return Status::ok();
  const ActView fin = executor_->final_hidden();
  arena.reset();
  float* xn = arena.take<float>(n * d);  // [n, d]
  for (int64_t i = 0; i < n; ++i) {
    ActView row = fin;
    row.tokens = 1;
    row.data =
        static_cast<std::byte*>(fin.data) +
        static_cast<size_t>(logit_rows[static_cast<size_t>(i)] * d) * act_dtype_size(fin.dtype);
    widen_rows(row, xn + i * d);
  }
  lm_head_logits(w_, opt, xn, n, arena, logits);
  return Status::ok();
}

Status PlannedForward::run(SequenceState& state, const ForwardOptions& opt, Arena& arena,
                           const int32_t* tokens, int64_t T, bool all_logits, float* logits) {
  const Segment seg{&state, 0, T};
  ATTNRES_RETURN_IF_ERROR(reserve_segments(Segments(&seg, 1)));
  std::vector<int64_t> rows;
  for (int64_t r = all_logits ? 0 : T - 1; r < T; ++r) rows.push_back(r);
  return run(Segments(&seg, 1), opt, arena, tokens, rows, logits);
}

}  // namespace attnres
