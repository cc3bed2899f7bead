#include "model/forward.h"

#include "model/blocks.h"
#include "model/projection.h"

namespace attnres {

void ModelSublayers::attention(int layer, const float* in, const bf16* in_h, float* out) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[static_cast<size_t>(layer)];
  if (lw.kda) {
    kda_block(c, *lw.kda, layer, segments_, in, in_h, T_, opt_, arena_, out);
  } else {
    mla_block(c, *lw.mla, layer, segments_, in, in_h, T_, opt_, arena_, out);
  }
}

void ModelSublayers::mlp(int layer, const float* in, const bf16* in_h, float* out) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[static_cast<size_t>(layer)];
  if (lw.moe) {
    moe_block(c, *lw.moe, in, in_h, T_, opt_, arena_, out);
  } else {
    dense_mlp_block(c, *lw.dense, in, in_h, T_, opt_, arena_, out);
  }
}

Status embed_tokens(const ModelWeights& w, const int32_t* tokens, int64_t T, float* out) {
  const int64_t d = w.config.hidden_size, V = w.config.vocab_size;
  for (int64_t t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= V)
      return Status(ErrorCode::kInvalidArgument, "token id " + std::to_string(tokens[t]) +
                                                     " at step position " + std::to_string(t) +
                                                     " is outside the vocabulary [0, " +
                                                     std::to_string(V) + ")");
  }
  // One dtype dispatch per row, not one call per element (which took 0.36% of the main thread's
  // decode samples on k3-mini).
  const TensorView& e = w.embed;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = tokens[t] * d;
    float* o = out + t * d;
    if (e.dtype == DType::kBF16) {
      const bf16* src = e.as<bf16>() + row;
      for (int64_t i = 0; i < d; ++i) o[i] = bf16_to_f32(src[i]);
    } else {
      for (int64_t i = 0; i < d; ++i) o[i] = e.get_f32(row + i);
    }
  }
  return Status::ok();
}

void lm_head_logits(const ModelWeights& w, const ForwardOptions& opt, const float* xn, int64_t rows,
                    Arena& arena, float* logits) {
  // The bf16 model's lm_head output is bf16 too; logits are reported as f32 values of it.
  // Tensor parallelism: this rank's vocabulary rows, then every rank's (one gather).
  const TpStep tp = tp_step(opt);
  const int64_t V = w.config.vocab_size;
  const Proj pj = make_proj(opt, arena);
  MatmulJob j = cols_job(xn, rows, w.lm_head, logits, tp.range(V).begin, V);
  project_batch(pj, &j, 1);
  tp.gather({part(logits, rows, V, 1, pj.bf16)});
}

}  // namespace attnres
