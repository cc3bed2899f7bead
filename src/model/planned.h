// The production forward step: the storage executor of plan/executor.h runs the forward
// program (plan/program.h: where the AttnRes semantics of this path are written down, step by
// step) under a verified storage plan (the `planned` policy by default) with the fused AttnRes
// step, over every row of a batched step (model/batch.h), calling the model's sublayers through
// ExecutorRunner. Same function as reference_forward() for each sequence; the model tests keep
// the two in agreement and compare both with the golden data.
//
// Contract: one PlannedForward per (model, activation dtype, token budget); it owns the
// executor's activation arena (allocated once, [token budget, d] per plan storage) and the
// widened norm gains. run() handles steps of 1..max_tokens() rows in any number of segments;
// the sublayer scratch comes from the caller's Arena, which is reset before every sublayer
// (nothing in it outlives a sublayer call), so the arena's size is that of the largest
// sublayer, not of the step. Not thread-safe: one run at a time.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "model/forward.h"
#include "plan/executor.h"
#include "plan/plan.h"

namespace attnres {

// Adapts ModelSublayers to the executor's SublayerRunner (ActView in bf16 or f32 storage).
class ExecutorRunner final : public SublayerRunner {
 public:
  explicit ExecutorRunner(ModelSublayers& sub) : sub_(sub) {}
  Status embed(std::span<const int32_t> tokens, const ActView& out) override;
  Status attention(int layer, const ActView& in, const ActView& out) override;
  Status mlp(int layer, const ActView& in, const ActView& out) override;

 private:
  template <typename Fn>
  Status run_sublayer(const ActView& in, const ActView& out, Fn fn);
  ModelSublayers& sub_;
};

class PlannedForward {
 public:
  static Result<std::unique_ptr<PlannedForward>> create(const ModelWeights& weights, ActDType dtype,
                                                        int64_t max_tokens,
                                                        Policy policy = Policy::kPlanned,
                                                        ReadKernel kernel = ReadKernel::kFused);
  // One step over the rows of `segments` (contiguous, in row order; tokens [T] in row order,
  // T <= max_tokens()). Every segment's cache must have room for its rows (reserve_segments);
  // the states absorb the rows (advance_segments) on success. logits receives [n, V]: row i is
  // the logits of step row logit_rows[i].
  // opt.act must equal the dtype given to create().
  Status run(Segments segments, const ForwardOptions& opt, Arena& arena, const int32_t* tokens,
             std::span<const int64_t> logit_rows, float* logits);
  // One sequence: T tokens; logits [T, V] (all_logits) or [1, V] (the last row). Reserves the
  // cache itself.
  Status run(SequenceState& state, const ForwardOptions& opt, Arena& arena, const int32_t* tokens,
             int64_t T, bool all_logits, float* logits);

  int64_t max_tokens() const { return executor_->options().max_tokens; }
  const Executor& executor() const { return *executor_; }

 private:
  PlannedForward(const ModelWeights& w) : w_(w) {}
  const ModelWeights& w_;
  std::vector<std::vector<float>> gains_;  // widened RMSNorm gains, each [d]
  ForwardParams params_;
  std::unique_ptr<Executor> executor_;
};

}  // namespace attnres
