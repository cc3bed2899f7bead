// Model configuration (Hugging Face config.json) and the derived layer schedule.
//
// Contract: every field the model needs is required; a missing, ill-typed or out-of-range field
// is an error that names the field and the file, and all problems are reported in one Status.
// Integers must fit their field's type (no wrapping), floats must be finite, sizes must lie
// within the bounds below, and token ids inside the vocabulary. Unknown
// fields are ignored. Optional fields are only those whose absence has a defined meaning
// (listed on each member). Reads both the published layout (top-level object with a
// `text_config`) and a bare text config.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/limits.h"
#include "util/status.h"

namespace attnres {

// Upper bounds of the config's size fields, far above any published model (Kimi-K3: hidden
// 7168, vocab 163840, 93 layers, 64 heads of 128, 384 experts). Every size the engine derives
// from a config is a product of at most three of them (tensor shapes, the KDA state
// H x dk x dv, arenas), so with these bounds no such product overflows int64, and a hostile
// config is refused at load instead of wrapping or over-allocating later. Also enforced:
// the limits of util/limits.h (AttnRes sources per read, KDA convolution width).
inline constexpr int64_t kMaxConfigWidth = int64_t{1} << 20;  // widths, ranks, heads, head dims
inline constexpr int64_t kMaxConfigVocab = INT32_MAX;         // token ids are int32
inline constexpr int kMaxConfigLayers = 1 << 16;
inline constexpr int kMaxConfigExperts = 1 << 16;  // routed and shared experts

enum class AttnKind { kKda, kMla };
enum class FfnKind { kDense, kMoe };
enum class Activation { kSitu, kSilu };
enum class ExpertFormat { kMxfp4, kDense };

std::string_view attn_kind_name(AttnKind k);  // "kda" | "mla"
std::string_view ffn_kind_name(FfnKind k);    // "dense" | "moe"

struct LayerInfo {
  int index = 0;
  AttnKind attention = AttnKind::kKda;
  FfnKind ffn = FfnKind::kDense;
  // AttnRes: slot this layer commits the running sum into, before its attention (i % B == 0).
  std::optional<int> commit_slot;
  // Sources seen by the pre-attention read (0 = read skipped: layer 0) and the pre-MLP read,
  // each counting the committed slots plus the running sum. 0 for plain-residual models.
  int pre_attn_sources = 0;
  int pre_mlp_sources = 0;
};

// Per-layer schedule derived from the config. For a plain-residual model (no
// attn_res_block_size) block_size == 0, bank_slots == 0 and no layer commits.
struct LayerSchedule {
  std::vector<LayerInfo> layers;
  int block_size = 0;              // B, counted in decoder layers
  int bank_slots = 0;              // ceil(layers / B)
  int final_sources = 0;           // bank_slots + 1 (the final mixture), 0 without AttnRes
  int max_sources = 0;             // over every read, final included
  std::vector<int> commit_layers;  // commit_layers[k] = layer that commits slot k (= k * B)
  int num_mla = 0, num_kda = 0, num_dense = 0, num_moe = 0;

  bool has_attnres() const { return block_size > 0; }
  int num_layers() const { return static_cast<int>(layers.size()); }
  // Number of AttnRes reads in one forward pass (2 per layer - 1 + the final read).
  int num_reads() const;
};

// The AttnRes part of the schedule only (attention/ffn kinds left at defaults): used by the
// planner, which needs nothing but the layer count and block size. block_size 0 = no AttnRes.
LayerSchedule attnres_schedule(int num_layers, int block_size);

struct LinearAttnConfig {
  std::vector<int> full_attn_layers;  // 1-based, as published
  std::vector<int> kda_layers;        // 1-based, as published
  int num_heads = 0;
  int head_dim = 0;
  int short_conv_kernel_size = 0;
  // Absent: Kimi-Linear's softplus gate `-exp(A_log) * softplus(f + dt_bias)`.
  std::optional<float> gate_lower_bound;
  // Absent or false: low-rank output gate (g_a_proj, g_b_proj) as in Kimi-Linear.
  bool use_full_rank_gate = false;
};

struct ModelConfig {
  std::string source;  // file the config was read from (for error messages)
  std::string model_type;

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int num_hidden_layers = 0;
  int64_t intermediate_size = 0;  // dense MLP
  float rms_norm_eps = 0;
  bool tie_word_embeddings = false;

  // MLA
  int num_attention_heads = 0;
  int q_lora_rank = 0;  // 0 when null: q_proj without LoRA
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool mla_use_nope = false;
  bool mla_use_output_gate = false;  // absent = false

  // FFN / MoE
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  int num_experts = 0;
  int num_experts_per_token = 0;
  int num_shared_experts = 0;
  int64_t moe_intermediate_size = 0;
  // Latent MoE (Kimi-K3). Absent = experts run at full width (Kimi-Linear).
  std::optional<int64_t> routed_expert_hidden_size;
  bool latent_moe_use_norm = false;  // required when routed_expert_hidden_size is present
  float routed_scaling_factor = 1.0f;
  bool moe_renormalize = true;
  ExpertFormat expert_format = ExpertFormat::kDense;  // kMxfp4 from quantization_config

  Activation hidden_act = Activation::kSitu;
  float situ_beta = 0;         // activation_situ_beta (required for situ)
  float situ_linear_beta = 0;  // activation_situ_linear_beta (required for situ)

  LinearAttnConfig linear;

  // Absent: plain residual model.
  std::optional<int> attn_res_block_size;

  std::optional<int64_t> bos_token_id, eos_token_id, pad_token_id;
  // Longest context the model was trained for; absent = no limit enforced.
  std::optional<int64_t> max_position_embeddings;

  LayerSchedule schedule;

  // MLA latent RMSNorm eps of the official code (KimiRMSNorm default), not rms_norm_eps.
  static constexpr float kMlaLatentNormEps = 1e-6f;
  // KDA q/k L2 norm eps: x / sqrt(sum(x^2) + eps).
  static constexpr float kKdaL2NormEps = 1e-6f;
};

// Parses config JSON text. `source` names the file in error messages.
Result<ModelConfig> parse_model_config(std::string_view json_text, const std::string& source);
// Reads and parses a config file.
Result<ModelConfig> load_model_config(const std::string& path);

}  // namespace attnres
