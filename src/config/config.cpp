#include "config/config.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "util/file.h"

namespace attnres {
namespace {

using json = nlohmann::json;

// Collects every problem of one config so they can be reported at once.
class FieldReader {
 public:
  FieldReader(const json& obj, std::string prefix) : obj_(obj), prefix_(std::move(prefix)) {}

  template <typename T>
  bool required(std::string_view key, T& out) {
    return read(key, out, /*required=*/true);
  }
  template <typename T>
  bool optional(std::string_view key, T& out) {
    return read(key, out, /*required=*/false);
  }
  bool present(std::string_view key) const {
    auto it = obj_.find(std::string(key));
    return it != obj_.end() && !it->is_null();
  }
  const json* object(std::string_view key) {
    auto it = obj_.find(std::string(key));
    if (it == obj_.end()) {
      add(ErrorCode::kMissingField, key, "is missing (expected an object)");
      return nullptr;
    }
    if (!it->is_object()) {
      add(ErrorCode::kWrongType, key,
          "has type " + std::string(it->type_name()) + ", expected an object");
      return nullptr;
    }
    return &*it;
  }
  void add(ErrorCode code, std::string_view key, const std::string& what) {
    if (errors_.empty()) first_code_ = code;
    errors_.push_back("field '" + prefix_ + std::string(key) + "' " + what);
  }
  // Takes over the problems found by a reader of a nested object.
  void merge(const FieldReader& nested) {
    if (errors_.empty() && !nested.errors_.empty()) first_code_ = nested.first_code_;
    errors_.insert(errors_.end(), nested.errors_.begin(), nested.errors_.end());
  }
  const std::vector<std::string>& errors() const { return errors_; }
  ErrorCode first_code() const { return first_code_; }
  const std::string& prefix() const { return prefix_; }

 private:
  template <typename T>
  bool read(std::string_view key, T& out, bool required) {
    auto it = obj_.find(std::string(key));
    if (it == obj_.end() || it->is_null()) {
      if (required)
        add(ErrorCode::kMissingField, key, "is missing (expected " + expected<T>() + ")");
      return false;
    }
    if (!type_ok<T>(*it)) {
      add(ErrorCode::kWrongType, key,
          "has type " + std::string(it->type_name()) + ", expected " + expected<T>());
      return false;
    }
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      // get<T>() would wrap an out-of-range integer (4294967389 layers read as 93).
      if (!fits<T>(*it)) {
        add(ErrorCode::kInvalidValue, key, "is " + it->dump() + ", expected " + range<T>());
        return false;
      }
    } else if constexpr (std::is_same_v<T, std::vector<int>>) {
      for (const json& e : *it) {
        if (!fits<int>(e)) {
          add(ErrorCode::kInvalidValue, key, "contains " + e.dump() + ", expected " + range<int>());
          return false;
        }
      }
    }
    out = it->get<T>();
    return true;
  }
  template <typename T>
  static std::string range() {
    return "an integer in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
           std::to_string(std::numeric_limits<T>::max()) + "]";
  }
  // Whether an integer JSON value is representable as T.
  template <typename T>
  static bool fits(const json& v) {
    if (v.is_number_unsigned())
      return v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    const int64_t x = v.get<int64_t>();
    return x >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
           x <= static_cast<int64_t>(std::numeric_limits<T>::max());
  }
  template <typename T>
  static bool type_ok(const json& v) {
    if constexpr (std::is_same_v<T, bool>)
      return v.is_boolean();
    else if constexpr (std::is_integral_v<T>)
      return v.is_number_integer();
    else if constexpr (std::is_floating_point_v<T>)
      return v.is_number();
    else if constexpr (std::is_same_v<T, std::string>)
      return v.is_string();
    else if constexpr (std::is_same_v<T, std::vector<int>>) {
      if (!v.is_array()) return false;
      return std::all_of(v.begin(), v.end(), [](const json& e) { return e.is_number_integer(); });
    } else
      return false;
  }
  template <typename T>
  static std::string expected() {
    if constexpr (std::is_same_v<T, bool>)
      return "a boolean";
    else if constexpr (std::is_integral_v<T>)
      return "an integer";
    else if constexpr (std::is_floating_point_v<T>)
      return "a number";
    else if constexpr (std::is_same_v<T, std::string>)
      return "a string";
    else
      return "an array of integers";
  }

  const json& obj_;
  std::string prefix_;
  std::vector<std::string> errors_;
  ErrorCode first_code_ = ErrorCode::kOk;
};

int ceil_div(int a, int b) {
  // In 64 bits: a + b - 1 overflows int for a huge block size (found by fuzz_config).
  return static_cast<int>((int64_t{a} + b - 1) / b);
}

}  // namespace

std::string_view attn_kind_name(AttnKind k) {
  return k == AttnKind::kKda ? "kda" : "mla";
}
std::string_view ffn_kind_name(FfnKind k) {
  return k == FfnKind::kDense ? "dense" : "moe";
}

int LayerSchedule::num_reads() const {
  if (!has_attnres() || layers.empty()) return 0;
  return 2 * num_layers() - 1 + 1;
}

LayerSchedule attnres_schedule(int num_layers, int block_size) {
  LayerSchedule s;
  s.layers.resize(static_cast<size_t>(std::max(num_layers, 0)));
  s.block_size = block_size > 0 ? block_size : 0;
  for (int i = 0; i < num_layers; ++i) s.layers[static_cast<size_t>(i)].index = i;
  if (s.block_size == 0 || num_layers <= 0) return s;
  const int B = s.block_size;
  s.bank_slots = ceil_div(num_layers, B);
  s.final_sources = s.bank_slots + 1;
  s.max_sources = s.final_sources;
  for (int i = 0; i < num_layers; ++i) {
    LayerInfo& l = s.layers[static_cast<size_t>(i)];
    if (i % B == 0) {
      l.commit_slot = i / B;
      s.commit_layers.push_back(i);
    }
    // Pre-attention read (before this layer's commit): slots committed at layers < i.
    l.pre_attn_sources = i == 0 ? 0 : ceil_div(i, B) + 1;
    // Pre-MLP read (after the commit): slots committed at layers <= i.
    l.pre_mlp_sources = i / B + 1 + 1;
    s.max_sources = std::max({s.max_sources, l.pre_attn_sources, l.pre_mlp_sources});
  }
  return s;
}

Result<ModelConfig> parse_model_config(std::string_view json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    return Status(ErrorCode::kBadJson,
                  source + ": config is not well-formed JSON: " + std::string(e.what()));
  }
  if (!root.is_object()) {
    return Status(ErrorCode::kWrongType, source + ": config root has type " +
                                             std::string(root.type_name()) +
                                             ", expected an object");
  }
  const json* text = &root;
  std::string prefix;
  if (auto it = root.find("text_config"); it != root.end()) {
    if (!it->is_object()) {
      return Status(ErrorCode::kWrongType, source + ": field 'text_config' has type " +
                                               std::string(it->type_name()) +
                                               ", expected an object");
    }
    text = &*it;
    prefix = "text_config.";
  }

  ModelConfig c;
  c.source = source;
  FieldReader r(*text, prefix);
  r.optional("model_type", c.model_type);
  r.required("vocab_size", c.vocab_size);
  r.required("hidden_size", c.hidden_size);
  r.required("num_hidden_layers", c.num_hidden_layers);
  r.required("intermediate_size", c.intermediate_size);
  double eps = 0;
  if (r.required("rms_norm_eps", eps)) c.rms_norm_eps = static_cast<float>(eps);
  if (!r.optional("tie_word_embeddings", c.tie_word_embeddings)) {
    // The published layout carries it at top level too.
    FieldReader top(root, "");
    top.optional("tie_word_embeddings", c.tie_word_embeddings);
  }

  r.required("num_attention_heads", c.num_attention_heads);
  if (r.present("q_lora_rank")) r.required("q_lora_rank", c.q_lora_rank);
  r.required("kv_lora_rank", c.kv_lora_rank);
  r.required("qk_nope_head_dim", c.qk_nope_head_dim);
  r.required("qk_rope_head_dim", c.qk_rope_head_dim);
  r.required("v_head_dim", c.v_head_dim);
  r.required("mla_use_nope", c.mla_use_nope);
  r.optional("mla_use_output_gate", c.mla_use_output_gate);

  r.required("first_k_dense_replace", c.first_k_dense_replace);
  r.required("moe_layer_freq", c.moe_layer_freq);
  r.required("num_experts", c.num_experts);
  r.required("num_experts_per_token", c.num_experts_per_token);
  r.required("num_shared_experts", c.num_shared_experts);
  r.required("moe_intermediate_size", c.moe_intermediate_size);
  double rsf = 0;
  if (r.required("routed_scaling_factor", rsf)) c.routed_scaling_factor = static_cast<float>(rsf);
  r.required("moe_renormalize", c.moe_renormalize);
  std::string router_act;
  if (r.required("moe_router_activation_func", router_act) && router_act != "sigmoid") {
    r.add(ErrorCode::kUnsupported, "moe_router_activation_func",
          "is \"" + router_act + "\", expected \"sigmoid\"");
  }
  if (r.present("routed_expert_hidden_size")) {
    int64_t v = 0;
    if (r.required("routed_expert_hidden_size", v)) c.routed_expert_hidden_size = v;
    r.required("latent_moe_use_norm", c.latent_moe_use_norm);
  }

  std::string act;
  if (r.required("hidden_act", act)) {
    if (act == "situ") {
      c.hidden_act = Activation::kSitu;
      double b = 0, bl = 0;
      if (r.required("activation_situ_beta", b)) c.situ_beta = static_cast<float>(b);
      if (r.required("activation_situ_linear_beta", bl))
        c.situ_linear_beta = static_cast<float>(bl);
    } else if (act == "silu") {
      c.hidden_act = Activation::kSilu;
    } else {
      r.add(ErrorCode::kUnsupported, "hidden_act",
            "is \"" + act + "\", expected \"situ\" or \"silu\"");
    }
  }

  if (r.present("attn_res_block_size")) {
    int b = 0;
    if (r.required("attn_res_block_size", b)) c.attn_res_block_size = b;
  }
  auto read_token = [&](const char* key, std::optional<int64_t>& out) {
    int64_t v = 0;
    if (r.optional(key, v)) {
      out = v;
    } else if (!r.present(key)) {
      FieldReader top(root, "");
      if (top.optional(key, v)) out = v;
    }
  };
  read_token("bos_token_id", c.bos_token_id);
  read_token("eos_token_id", c.eos_token_id);
  read_token("pad_token_id", c.pad_token_id);
  if (r.present("max_position_embeddings")) {
    int64_t v = 0;
    if (r.required("max_position_embeddings", v)) c.max_position_embeddings = v;
  }

  if (const json* lac = r.object("linear_attn_config")) {
    FieldReader l(*lac, prefix + "linear_attn_config.");
    l.required("full_attn_layers", c.linear.full_attn_layers);
    l.required("kda_layers", c.linear.kda_layers);
    l.required("num_heads", c.linear.num_heads);
    l.required("head_dim", c.linear.head_dim);
    l.required("short_conv_kernel_size", c.linear.short_conv_kernel_size);
    if (l.present("gate_lower_bound")) {
      double g = 0;
      if (l.required("gate_lower_bound", g)) c.linear.gate_lower_bound = static_cast<float>(g);
    }
    l.optional("use_full_rank_gate", c.linear.use_full_rank_gate);
    r.merge(l);
  }

  if (const json* qc = text->contains("quantization_config")  ? &(*text)["quantization_config"]
                       : root.contains("quantization_config") ? &root["quantization_config"]
                                                              : nullptr;
      qc != nullptr && !qc->is_null()) {
    if (!qc->is_object()) {
      r.add(ErrorCode::kWrongType, "quantization_config", "is not an object");
    } else {
      FieldReader q(*qc, prefix + "quantization_config.");
      std::string fmt;
      if (q.required("format", fmt)) {
        if (fmt == "mxfp4-pack-quantized") {
          c.expert_format = ExpertFormat::kMxfp4;
        } else {
          r.add(ErrorCode::kUnsupported, "quantization_config.format",
                "is \"" + fmt + "\", expected \"mxfp4-pack-quantized\"");
        }
      }
      r.merge(q);
    }
  }

  // Value checks (only on fields that were read). Every size is bounded above as well
  // (config.h), so size arithmetic on the config cannot overflow anywhere downstream.
  auto within = [&](std::string_view key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      r.add(ErrorCode::kInvalidValue, key,
            "is " + std::to_string(v) + ", expected " + std::to_string(lo) + ".." +
                std::to_string(hi));
  };
  auto width = [&](std::string_view key, int64_t v) { within(key, v, 1, kMaxConfigWidth); };
  // A float field that must be finite (a JSON number beyond float range reads as infinity)
  // and, with `positive`, > 0.
  auto finite = [&](std::string_view key, float v, bool positive) {
    if (std::isfinite(v) && (!positive || v > 0)) return;
    char shown[32];
    std::snprintf(shown, sizeof shown, "%g", static_cast<double>(v));
    r.add(ErrorCode::kInvalidValue, key,
          std::string("is ") + shown + " as a float, expected a finite number" +
              (positive ? " > 0" : ""));
  };
  if (r.errors().empty()) {
    within("vocab_size", c.vocab_size, 1, kMaxConfigVocab);
    width("hidden_size", c.hidden_size);
    // Bounded so the per-layer tables below stay small on hostile input (found by fuzz_config).
    within("num_hidden_layers", c.num_hidden_layers, 1, kMaxConfigLayers);
    width("intermediate_size", c.intermediate_size);
    width("num_attention_heads", c.num_attention_heads);
    within("q_lora_rank", c.q_lora_rank, 0, kMaxConfigWidth);
    width("kv_lora_rank", c.kv_lora_rank);
    within("qk_nope_head_dim", c.qk_nope_head_dim, 0, kMaxConfigWidth);
    within("qk_rope_head_dim", c.qk_rope_head_dim, 0, kMaxConfigWidth);
    width("v_head_dim", c.v_head_dim);
    within("moe_layer_freq", c.moe_layer_freq, 1, kMaxConfigLayers);
    width("linear_attn_config.num_heads", c.linear.num_heads);
    width("linear_attn_config.head_dim", c.linear.head_dim);
    // The KDA convolution keeps its window in fixed tables (util/limits.h).
    within("linear_attn_config.short_conv_kernel_size", c.linear.short_conv_kernel_size, 1,
           kMaxConvWidth);
    if (c.qk_nope_head_dim >= 0 && c.qk_rope_head_dim >= 0 &&
        int64_t{c.qk_nope_head_dim} + c.qk_rope_head_dim <= 0)
      r.add(ErrorCode::kInvalidValue, "qk_nope_head_dim",
            "plus qk_rope_head_dim must be > 0 (got " + std::to_string(c.qk_nope_head_dim) + " + " +
                std::to_string(c.qk_rope_head_dim) + ")");
    finite("rms_norm_eps", c.rms_norm_eps, /*positive=*/true);
    finite("routed_scaling_factor", c.routed_scaling_factor, /*positive=*/false);
    if (c.linear.gate_lower_bound)
      finite("linear_attn_config.gate_lower_bound", *c.linear.gate_lower_bound, false);
    if (c.first_k_dense_replace < 0 || c.first_k_dense_replace > c.num_hidden_layers)
      r.add(ErrorCode::kInvalidValue, "first_k_dense_replace",
            "is " + std::to_string(c.first_k_dense_replace) + ", expected 0.." +
                std::to_string(c.num_hidden_layers));
    if (c.first_k_dense_replace < c.num_hidden_layers) {
      within("num_experts", c.num_experts, 1, kMaxConfigExperts);
      width("moe_intermediate_size", c.moe_intermediate_size);
      if (c.num_experts_per_token <= 0 || c.num_experts_per_token > c.num_experts)
        r.add(ErrorCode::kInvalidValue, "num_experts_per_token",
              "is " + std::to_string(c.num_experts_per_token) + ", expected 1.." +
                  std::to_string(c.num_experts));
      within("num_shared_experts", c.num_shared_experts, 0, kMaxConfigExperts);
      if (c.routed_expert_hidden_size)
        width("routed_expert_hidden_size", *c.routed_expert_hidden_size);
    }
    if (c.max_position_embeddings && *c.max_position_embeddings <= 0)
      r.add(ErrorCode::kInvalidValue, "max_position_embeddings",
            "is " + std::to_string(*c.max_position_embeddings) + ", expected > 0");
    if (c.attn_res_block_size && *c.attn_res_block_size <= 0)
      r.add(ErrorCode::kInvalidValue, "attn_res_block_size",
            "is " + std::to_string(*c.attn_res_block_size) + ", expected > 0");
    // Token ids the engine feeds to or compares with the model: inside the vocabulary.
    for (const auto& [key, id] :
         {std::pair<const char*, const std::optional<int64_t>&>{"bos_token_id", c.bos_token_id},
          {"eos_token_id", c.eos_token_id},
          {"pad_token_id", c.pad_token_id}}) {
      if (id && (*id < 0 || *id >= c.vocab_size))
        r.add(ErrorCode::kInvalidValue, key,
              "is " + std::to_string(*id) + ", expected a token id in 0.." +
                  std::to_string(c.vocab_size - 1) + " (vocab_size " +
                  std::to_string(c.vocab_size) + ")");
    }
    if (c.hidden_act == Activation::kSitu) {
      finite("activation_situ_beta", c.situ_beta, /*positive=*/true);
      finite("activation_situ_linear_beta", c.situ_linear_beta, /*positive=*/true);
    }
    if (c.expert_format == ExpertFormat::kMxfp4) {
      const int64_t k1 = c.routed_expert_hidden_size.value_or(c.hidden_size);
      if (k1 % 32 != 0 || c.moe_intermediate_size % 32 != 0)
        r.add(ErrorCode::kInconsistent, "quantization_config",
              "is MXFP4 (32-element blocks) but the expert dims " + std::to_string(k1) + " and " +
                  std::to_string(c.moe_intermediate_size) + " are not multiples of 32");
    }
  }
  // The AttnRes reads of the schedule must fit the kernels' source tables (util/limits.h).
  if (r.errors().empty() && c.attn_res_block_size) {
    const int L = c.num_hidden_layers, B = *c.attn_res_block_size;
    const int64_t sources = ceil_div(L, B) + int64_t{1};  // the final read: every slot + rs
    if (sources > kMaxAttnResSources) {
      const int min_block = ceil_div(L, kMaxAttnResSources - 1);
      r.add(ErrorCode::kUnsupported, "attn_res_block_size",
            "is " + std::to_string(B) + " with num_hidden_layers " + std::to_string(L) +
                ": the final AttnRes read would see " + std::to_string(sources) +
                " sources (ceil(" + std::to_string(L) + " / " + std::to_string(B) +
                ") bank slots + the running sum), at most " + std::to_string(kMaxAttnResSources) +
                " are supported (attn_res_block_size >= " + std::to_string(min_block) + " for " +
                std::to_string(L) + " layers)");
    }
  }

  // Layer lists: 1-based, disjoint, covering 1..L exactly once.
  if (r.errors().empty()) {
    const int L = c.num_hidden_layers;
    std::vector<int> owner(static_cast<size_t>(L) + 1, 0);  // 0 none, 1 full, 2 kda
    auto mark = [&](const std::vector<int>& list, int tag, const char* name) {
      for (int v : list) {
        if (v < 1 || v > L) {
          r.add(ErrorCode::kInconsistent, std::string("linear_attn_config.") + name,
                "contains " + std::to_string(v) + ", expected 1-based layer numbers 1.." +
                    std::to_string(L));
          continue;
        }
        if (owner[static_cast<size_t>(v)] != 0) {
          r.add(ErrorCode::kInconsistent, std::string("linear_attn_config.") + name,
                "lists layer " + std::to_string(v) + " more than once or in both lists");
          continue;
        }
        owner[static_cast<size_t>(v)] = tag;
      }
    };
    mark(c.linear.full_attn_layers, 1, "full_attn_layers");
    mark(c.linear.kda_layers, 2, "kda_layers");
    std::string missing;
    for (int v = 1; v <= L; ++v)
      if (owner[static_cast<size_t>(v)] == 0)
        missing += (missing.empty() ? "" : ", ") + std::to_string(v);
    if (!missing.empty())
      r.add(ErrorCode::kInconsistent, "linear_attn_config",
            "leaves layers " + missing + " (1-based) in neither full_attn_layers nor kda_layers");
    if (r.errors().empty()) {
      c.schedule = attnres_schedule(L, c.attn_res_block_size.value_or(0));
      for (int i = 0; i < L; ++i) {
        LayerInfo& li = c.schedule.layers[static_cast<size_t>(i)];
        li.attention = owner[static_cast<size_t>(i) + 1] == 1 ? AttnKind::kMla : AttnKind::kKda;
        li.ffn = (i >= c.first_k_dense_replace && i % c.moe_layer_freq == 0) ? FfnKind::kMoe
                                                                             : FfnKind::kDense;
        (li.attention == AttnKind::kMla ? c.schedule.num_mla : c.schedule.num_kda)++;
        (li.ffn == FfnKind::kMoe ? c.schedule.num_moe : c.schedule.num_dense)++;
      }
    }
  }

  if (!r.errors().empty()) {
    std::string msg = source + ": " + std::to_string(r.errors().size()) + " config problem" +
                      (r.errors().size() > 1 ? "s" : "") + ":";
    for (const auto& e : r.errors()) msg += "\n  " + e;
    return Status(r.first_code(), msg);
  }
  return c;
}

Result<ModelConfig> load_model_config(const std::string& path) {
  ATTNRES_ASSIGN_OR_RETURN(std::string text, read_model_file(path, "config file"));
  return parse_model_config(text, path);
}

}  // namespace attnres
