// Session: one sequence being generated. It holds the model state (KDA recurrent and conv
// states, the paged MLA latent cache in a pool of its own), the planned forward (storage
// executor with the `planned` policy, buffers for one prefill chunk) and the per-step scratch
// arena. Prefill runs in chunks of at most `chunk_size` tokens (default 4096); decode appends
// one token per step. After the first step of each shape no heap allocation happens per layer
// (the arena keeps its size; the cache takes a page every page_tokens positions).
//
// Thread-safety: a Session is used by one thread at a time; many sessions may share one
// immutable ModelWeights.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "io/weights.h"
#include "model/arena.h"
#include "model/kv_cache.h"
#include "model/options.h"
#include "model/planned.h"
#include "model/state.h"
#include "util/status.h"

namespace attnres {

struct SessionOptions {
  ForwardOptions forward;     // activation dtype, cache dtype, KDA chunk length
  int64_t chunk_size = 4096;  // prefill chunk (also the executor's buffer rows)
  int64_t page_tokens = 64;   // latent-cache page size (positions)
  // The storage executor with the `planned` policy (default), or the reference forward with
  // separately stored values (for cross-checks).
  bool planned = true;
  ReadKernel read_kernel = ReadKernel::kFused;
};

class Session {
 public:
  static Result<std::unique_ptr<Session>> create(const ModelWeights& weights,
                                                 const SessionOptions& options);

  // Appends tokens (any number, in chunks). logits receives [n, V] for every token when
  // all_logits, else [V] for the last one. Resized as needed.
  Status prefill(std::span<const int32_t> tokens, bool all_logits, std::vector<float>& logits);
  // Appends one token; logits [V].
  Status decode(int32_t token, std::span<float> logits);

  int64_t position() const { return state_.position; }
  int64_t vocab_size() const { return weights_.config.vocab_size; }
  void reset() { state_.clear(); }
  const SessionOptions& options() const { return options_; }
  const SequenceState& state() const { return state_; }
  const Arena& arena() const { return arena_; }
  // Wall time spent in AttnRes reads by this session's planned executor (0 on the reference
  // path, which is not instrumented).
  double attnres_read_seconds() const {
    return planned_ ? planned_->executor().read_seconds() : 0.0;
  }
  // Wall time and weight bytes of this session's projection batches, dense and MXFP4 apart
  // (ProjectionStats says which products count).
  const ProjectionStats& projection_stats() const { return projection_stats_; }

 private:
  Session(const ModelWeights& w, const SessionOptions& o);
  Status step(const int32_t* tokens, int64_t T, bool all_logits, float* logits);

  const ModelWeights& weights_;
  SessionOptions options_;
  KvPool pool_;
  SequenceState state_;
  Arena arena_;
  std::unique_ptr<PlannedForward> planned_;
  ProjectionStats projection_stats_;
};

// Greedy generation: prefill the prompt, then take the argmax (lowest id on ties) of every
// row, feeding each chosen token back, until max_new_tokens are chosen or `stop_token` is
// chosen (it is kept). With keep_logits, prefill_logits is [P, V] and decode_logits [G, V]
// where row j is the row token j was chosen from (row 0 = the last prefill row).
struct GenerateResult {
  std::vector<int32_t> generated;  // [G]
  std::vector<float> prefill_logits, decode_logits;
  double prefill_seconds = 0, decode_seconds = 0;
};
Result<GenerateResult> generate_greedy(Session& session, std::span<const int32_t> prompt,
                                       int64_t max_new_tokens, int64_t stop_token,
                                       bool keep_logits);

int32_t argmax(std::span<const float> row);

}  // namespace attnres
