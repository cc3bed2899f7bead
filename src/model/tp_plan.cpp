#include "model/tp_plan.h"

#include "io/weights.h"
#include "model/state.h"

namespace attnres {

std::vector<TpRankPlan> tp_rank_plans(const ModelConfig& c, int ranks) {
  const std::vector<TensorSpec> specs = model_tensor_specs(c);
  std::vector<TpRankPlan> out;
  const double expert_fraction =
      c.num_experts > 0 ? static_cast<double>(c.num_experts_per_token) / c.num_experts : 0.0;
  for (int r = 0; r < ranks; ++r) {
    const Shard shard{r, ranks};
    TpRankPlan p;
    p.rank = r;
    for (const TensorSpec& s : specs) {
      const DType dt = s.u8 ? DType::kU8 : release_dtype(s.name);
      const int64_t b = shard_tensor_bytes(s, dt, shard);
      p.weight_bytes += b;
      if (s.split_units == 0) p.replicated_bytes += b;
      if (s.name.ends_with("kv_b_proj.weight"))  // split by heads
        p.copy_bytes += absorbed_head_bytes(dt, shard.range(s.split_units).size(),
                                            c.qk_nope_head_dim, c.v_head_dim, s.shape[1]);
      if (s.name == "embed_tokens.weight") {
        p.read_bytes_per_token += b / s.shape[0];  // one row
      } else if (s.name.find(".experts.") != std::string::npos) {
        p.read_bytes_per_token += static_cast<int64_t>(static_cast<double>(b) * expert_fraction);
      } else {
        p.read_bytes_per_token += b;
      }
    }
    if (c.tie_word_embeddings)  // the head is this rank's rows of the embedding
      p.read_bytes_per_token += shard.range(c.vocab_size).size() * c.hidden_size * 2;
    // Its heads' states (kda_state_bytes of one head, times its heads).
    const int64_t per_head = kda_state_bytes(c, Shard{0, static_cast<int>(c.linear.num_heads)});
    p.kda_state_bytes = per_head * shard.range(c.linear.num_heads).size();
    out.push_back(p);
  }
  return out;
}

TpTraffic tp_decode_traffic(const ModelConfig& c, int ranks, bool bf16) {
  TpTraffic t;
  if (ranks <= 1) return t;
  const int64_t e = bf16 ? 2 : 4, d = c.hidden_size;
  t.control = 1;
  // KDA: the heads' outputs, o_proj's rows.
  const int64_t kda_bytes = (c.linear.num_heads * c.linear.head_dim + d) * e;
  t.kda = 2;
  // MLA: the latents (q_a and kv_a in one gather), the heads' outputs, o_proj's rows.
  const int64_t mla_bytes = (c.q_lora_rank + c.kv_lora_rank + c.qk_rope_head_dim +
                             c.num_attention_heads * c.v_head_dim + d) *
                            e;
  t.mla = 3;
  // MoE: router scores (f32) with the latents, the selected experts' intermediates with the
  // shared experts', the latent aggregate, the output rows.
  const bool latent = c.routed_expert_hidden_size.has_value();
  const int64_t r = c.routed_expert_hidden_size.value_or(d);
  const int64_t shared = int64_t{c.num_shared_experts} * c.moe_intermediate_size;
  const int64_t moe_bytes =
      c.num_experts * 4 + (latent ? r * e : 0) +
      (int64_t{c.num_experts_per_token} * c.moe_intermediate_size + shared) * e +
      (latent ? r * e : 0) + d * e;
  t.moe = latent ? 4 : 3;
  // Dense: the intermediate, the output rows.
  const int64_t dense_bytes = (c.intermediate_size + d) * e;
  t.dense = 2;
  t.lm_head = 1;
  for (const LayerInfo& l : c.schedule.layers) {
    if (l.attention == AttnKind::kKda) {
      t.gathers += t.kda;
      t.gather_bytes += kda_bytes;
    } else {
      t.gathers += t.mla;
      t.gather_bytes += mla_bytes;
    }
    if (l.ffn == FfnKind::kMoe) {
      t.gathers += t.moe;
      t.gather_bytes += moe_bytes;
    } else {
      t.gathers += t.dense;
      t.gather_bytes += dense_bytes;
    }
  }
  t.gathers += t.lm_head;
  t.gather_bytes += c.vocab_size * e;
  return t;
}

}  // namespace attnres
