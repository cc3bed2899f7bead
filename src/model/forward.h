// Pieces of the Kimi-K3 forward step (k3-model.md section 2) shared by its two paths:
// - the production path (model/planned.h): the storage executor runs the forward program under
//   a verified plan over every row of a batched step;
// - the reference path (model/reference.h): the straightforward dataflow of one sequence,
//   every value in its own storage, a scalar AttnRes read (tests cross-check the two).
// Both call the model's sublayers through ModelSublayers.
#pragma once

#include <cstdint>

#include "io/weights.h"
#include "model/arena.h"
#include "model/batch.h"
#include "model/options.h"
#include "model/state.h"
#include "util/status.h"

namespace attnres {

// The model's sublayers over f32 activations of one step: T rows split into `segments`
// (model/batch.h). Inputs are already normalised (input_layernorm / post_attention_layernorm
// applied by the caller, as the executor's fused AttnRes step does); `out` [T, d] may alias `in`;
// `in_h`: the same values as `in` in bf16 when the caller holds them (else null), which the
// projections then read instead of a copy of `in`.
class ModelSublayers {
 public:
  ModelSublayers(const ModelWeights& weights, Segments segments, const ForwardOptions& opt,
                 Arena& arena, int64_t T)
      : w_(weights), segments_(segments), opt_(opt), arena_(arena), T_(T) {}
  // out = self_attn(in) of layer `layer` (KDA or MLA; each segment's state absorbs its rows).
  void attention(int layer, const float* in, const bf16* in_h, float* out);
  // out = mlp(in) (dense SiTU MLP or latent MoE).
  void mlp(int layer, const float* in, const bf16* in_h, float* out);
  int64_t tokens() const { return T_; }
  const ModelWeights& weights() const { return w_; }
  const ForwardOptions& options() const { return opt_; }
  Arena& arena() { return arena_; }

 private:
  const ModelWeights& w_;
  Segments segments_;
  const ForwardOptions& opt_;
  Arena& arena_;
  int64_t T_;
};

// Embedding rows [T, d] for the tokens (rows widened to f32); checks ids.
Status embed_tokens(const ModelWeights& weights, const int32_t* tokens, int64_t T, float* out);
// logits [rows, V] = lm_head(xn) for normalised rows xn [rows, d] (scratch from arena).
void lm_head_logits(const ModelWeights& weights, const ForwardOptions& opt, const float* xn,
                    int64_t rows, Arena& arena, float* logits);

}  // namespace attnres
