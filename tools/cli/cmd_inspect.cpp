// attnres inspect: validate a config (and, with a model directory, bind every tensor), then
// print the config summary, the layer schedule and the AttnRes bank/commit facts.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "config/config.h"

namespace attnres::cli {
namespace {

nlohmann::json schedule_json(const ModelConfig& c) {
  const LayerSchedule& s = c.schedule;
  nlohmann::json j;
  j["config"] = c.source;
  j["num_layers"] = s.num_layers();
  j["hidden_size"] = c.hidden_size;
  j["vocab_size"] = c.vocab_size;
  j["attn_res_block_size"] = s.has_attnres() ? nlohmann::json(s.block_size) : nlohmann::json();
  j["bank_slots"] = s.bank_slots;
  j["max_sources"] = s.max_sources;
  j["final_sources"] = s.final_sources;
  j["num_reads"] = s.num_reads();
  j["commit_layers"] = s.commit_layers;
  j["num_mla"] = s.num_mla;
  j["num_kda"] = s.num_kda;
  j["num_dense"] = s.num_dense;
  j["num_moe"] = s.num_moe;
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerInfo& l : s.layers) {
    layers.push_back(
        {{"index", l.index},
         {"attention", attn_kind_name(l.attention)},
         {"ffn", ffn_kind_name(l.ffn)},
         {"commit_slot", l.commit_slot ? nlohmann::json(*l.commit_slot) : nlohmann::json()},
         {"pre_attn_sources", l.pre_attn_sources},
         {"pre_mlp_sources", l.pre_mlp_sources}});
  }
  j["layers"] = layers;
  return j;
}

void print_schedule(const ModelConfig& c) {
  const LayerSchedule& s = c.schedule;
  std::printf("config        %s\n", c.source.c_str());
  std::printf("layers        %d (%d KDA, %d MLA; %d dense FFN, %d MoE)\n", s.num_layers(),
              s.num_kda, s.num_mla, s.num_dense, s.num_moe);
  std::printf("hidden        %lld, vocab %lld, rms_norm_eps %g\n",
              static_cast<long long>(c.hidden_size), static_cast<long long>(c.vocab_size),
              static_cast<double>(c.rms_norm_eps));
  std::printf("KDA           %d heads x %d, conv %d, gate %s\n", c.linear.num_heads,
              c.linear.head_dim, c.linear.short_conv_kernel_size,
              c.linear.gate_lower_bound ? "lower-bound sigmoid" : "softplus");
  std::printf("MLA           %d heads, q_lora %d, kv_lora %d, qk %d+%d, v %d\n",
              c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim,
              c.qk_rope_head_dim, c.v_head_dim);
  std::printf(
      "MoE           %d experts, top-%d, %d shared, inter %lld, latent %s, %s\n", c.num_experts,
      c.num_experts_per_token, c.num_shared_experts,
      static_cast<long long>(c.moe_intermediate_size),
      c.routed_expert_hidden_size ? std::to_string(*c.routed_expert_hidden_size).c_str() : "none",
      c.expert_format == ExpertFormat::kMxfp4 ? "MXFP4 experts" : "dense experts");
  if (s.has_attnres()) {
    std::printf("AttnRes       block %d, %d bank slots, %d reads, at most %d sources per read\n",
                s.block_size, s.bank_slots, s.num_reads(), s.max_sources);
    std::printf("commits      ");
    for (size_t k = 0; k < s.commit_layers.size(); ++k)
      std::printf(" slot %zu@L%d", k, s.commit_layers[k]);
    std::printf("\n");
  } else {
    std::printf("AttnRes       none (plain residual model)\n");
  }
  std::printf("\n%5s %-4s %-5s %6s %5s %5s\n", "layer", "attn", "ffn", "commit", "preA", "preM");
  for (const LayerInfo& l : s.layers) {
    std::printf("%5d %-4s %-5s %6s %5d %5d\n", l.index,
                std::string(attn_kind_name(l.attention)).c_str(),
                std::string(ffn_kind_name(l.ffn)).c_str(),
                l.commit_slot ? std::to_string(*l.commit_slot).c_str() : "-", l.pre_attn_sources,
                l.pre_mlp_sources);
  }
}

struct InspectArgs {
  std::string model_dir;
  std::string config;
  bool json = false;
};

int run_inspect(const InspectArgs& a) {
  if (a.model_dir.empty() == a.config.empty())
    return fail("inspect: give exactly one of MODEL_DIR or --config FILE");
  const std::string config_path = a.config.empty() ? a.model_dir + "/config.json" : a.config;
  auto cfg = load_model_config(config_path);
  if (!cfg) return fail(cfg.status().to_string());
  if (a.json) {
    std::cout << schedule_json(*cfg).dump(2) << "\n";
  } else {
    print_schedule(*cfg);
  }
  return 0;
}

const CommandRegistration kReg("inspect", "Validate a model (or config) and print its schedule",
                               [](CLI::App* sub) -> CommandRun {
                                 auto a = std::make_shared<InspectArgs>();
                                 sub->add_option("MODEL_DIR", a->model_dir,
                                                 "Model directory in the published layout");
                                 sub->add_option("--config", a->config,
                                                 "Config file only (no weights)");
                                 sub->add_flag("--json", a->json, "Machine-readable output");
                                 return [a] { return run_inspect(*a); };
                               });

}  // namespace
}  // namespace attnres::cli
