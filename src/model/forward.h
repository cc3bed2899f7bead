// The Kimi-K3 forward step in HF order (k3-model.md section 2): embeddings, 93 (or any number
// of) decoder layers with Block Attention Residuals, the final mixture, final norm, lm_head.
// Also the plain-residual path for configs without attn_res_block_size.
//
// Two forward paths over the same sublayers (ModelSublayers):
// - reference_forward(): the straightforward dataflow, every value in its own storage, a scalar
//   AttnRes read; it also honours the test-only misreadings and reports intermediates.
// - the planned path (model/planned.h): plan/executor.h runs the same program under a storage
//   plan (the runtime uses the `planned` policy); tests keep the two in agreement.
//
// Contract: one step over T new tokens at positions state.position .. +T-1; the state absorbs
// them. Token ids are checked (kInvalidArgument naming the position). Scratch comes from
// `arena`, which the caller resets between steps.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "io/weights.h"
#include "model/arena.h"
#include "model/options.h"
#include "model/state.h"
#include "util/limits.h"
#include "util/status.h"

namespace attnres {

// The model's sublayers over f32 activations. Inputs are already normalised
// (input_layernorm / post_attention_layernorm applied by the caller, as the executor's fused
// AttnRes step does); `out` [T, d] may alias `in`.
class ModelSublayers {
 public:
  ModelSublayers(const ModelWeights& weights, SequenceState& state, const ForwardOptions& opt,
                 Arena& arena, int64_t T)
      : w_(weights), state_(state), opt_(opt), arena_(arena), T_(T) {}
  // out = self_attn(in) of layer `layer` (KDA or MLA; the state absorbs the T tokens).
  void attention(int layer, const float* in, float* out);
  // out = mlp(in) (dense SiTU MLP or latent MoE).
  void mlp(int layer, const float* in, float* out);
  int64_t tokens() const { return T_; }
  const ModelWeights& weights() const { return w_; }
  const ForwardOptions& options() const { return opt_; }
  Arena& arena() { return arena_; }

 private:
  const ModelWeights& w_;
  SequenceState& state_;
  const ForwardOptions& opt_;
  Arena& arena_;
  int64_t T_;
};

// Most sources one AttnRes read may have (util/limits.h; config validation enforces it).
inline constexpr int kMaxReadSources = kMaxAttnResSources;

// Scalar AttnRes read over S <= kMaxReadSources sources (sources[j] is [T, d]):
//   score_j = dot(v_j, q) * rsqrt(mean(v_j^2) + eps); p = softmax(score); out = sum_j p_j v_j,
// in f32, rounded to bf16 when bf16_out. out must not alias a source.
void model_attnres_read(const float* const* sources, int S, const float* q, int64_t T, int64_t d,
                        float eps, bool bf16_out, float* out);

// Receives named intermediates ("embed", "layer3.attn_out", "layer3.bank.1", "final_norm", ...);
// data is [rows, cols] f32. Used by the per-layer golden tests.
using CaptureFn =
    std::function<void(const std::string& name, const float* data, int64_t rows, int64_t cols)>;

// Runs the step and writes logits [T, V] (all_logits) or [1, V] (the last row only).
Status reference_forward(const ModelWeights& weights, SequenceState& state,
                         const ForwardOptions& opt, Arena& arena, const int32_t* tokens, int64_t T,
                         bool all_logits, float* logits, const CaptureFn* capture = nullptr);

// Embedding rows [T, d] for the tokens (rows widened to f32); checks ids.
Status embed_tokens(const ModelWeights& weights, const int32_t* tokens, int64_t T, float* out);
// logits [rows, V] = lm_head(xn) for normalised rows xn [rows, d] (scratch from arena).
void lm_head_logits(const ModelWeights& weights, const ForwardOptions& opt, const float* xn,
                    int64_t rows, Arena& arena, float* logits);
// logits [rows, V] = lm_head(norm(h)) for the given rows of h [rows, d]; h is not modified.
void final_logits(const ModelWeights& weights, const ForwardOptions& opt, Arena& arena,
                  const float* h, int64_t rows, float* logits, const CaptureFn* capture);

}  // namespace attnres
