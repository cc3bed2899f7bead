// attnres inspect: validate a config, or a model directory with everything run, generate and
// chat will need (every tensor, the storage plan, the tokenizer when present:
// check/model_check.h), then print the config summary, the layer schedule, the AttnRes
// bank/commit facts, the weights and the tokenizer. Exit status 1 on any problem.
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "check/model_check.h"
#include "command.h"
#include "config/config.h"
#include "io/safetensors.h"
#include "io/weights.h"

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

// Parameters per part of the model. `stored` counts stored elements (an MXFP4 byte holds two
// parameters); `logical` counts model parameters (MXFP4 matrices as rows x cols).
struct PartCount {
  int64_t logical = 0;
  int64_t bytes = 0;
};

class ParamCounter {
 public:
  void add(const std::string& part, const TensorView& t) {
    if (t.name.empty()) return;  // not bound (e.g. the low-rank gate of a full-rank model)
    parts_[part].logical += t.numel();
    parts_[part].bytes += static_cast<int64_t>(t.nbytes);
  }
  void add(const std::string& part, const ExpertMatrix& m) {
    if (!m.mxfp4) return add(part, m.dense);
    parts_[part].logical += m.rows * m.cols;
    parts_[part].bytes += static_cast<int64_t>(m.packed.nbytes + m.scale.nbytes);
  }
  const std::map<std::string, PartCount>& parts() const { return parts_; }

 private:
  std::map<std::string, PartCount> parts_;
};

ParamCounter count_params(const ModelWeights& w) {
  ParamCounter pc;
  pc.add("embedding", w.embed);
  if (!w.config.tie_word_embeddings) pc.add("lm_head", w.lm_head);
  pc.add("norms", w.final_norm);
  pc.add("attn_res", w.out_res_norm);
  pc.add("attn_res", w.out_res_proj);
  for (const LayerWeights& l : w.layers) {
    for (const TensorView* t :
         {&l.attn_res_norm, &l.attn_res_proj, &l.mlp_res_norm, &l.mlp_res_proj})
      pc.add("attn_res", *t);
    pc.add("norms", l.input_norm);
    pc.add("norms", l.post_attn_norm);
    if (const auto& k = l.kda) {
      for (const TensorView* t : {&k->q_proj, &k->k_proj, &k->v_proj, &k->q_conv, &k->k_conv,
                                  &k->v_conv, &k->f_a_proj, &k->f_b_proj, &k->b_proj, &k->g_proj,
                                  &k->g_a_proj, &k->g_b_proj, &k->dt_bias, &k->o_norm, &k->o_proj})
        pc.add("kda", *t);
      pc.add("kda", k->a_log_stored);
    }
    if (const auto& m = l.mla) {
      for (const TensorView* t :
           {&m->q_a_proj, &m->q_a_norm, &m->q_b_proj, &m->q_proj, &m->kv_a_proj, &m->kv_a_norm,
            &m->kv_b_proj, &m->g_proj, &m->o_proj})
        pc.add("mla", *t);
    }
    if (const auto& d = l.dense) {
      for (const TensorView* t : {&d->gate, &d->up, &d->down}) pc.add("dense_mlp", *t);
    }
    if (const auto& e = l.moe) {
      pc.add("router", e->gate);
      pc.add("router", e->gate_bias);
      for (const ExpertWeights& x : e->experts) {
        pc.add("routed_experts", x.w1);
        pc.add("routed_experts", x.w2);
        pc.add("routed_experts", x.w3);
      }
      for (const TensorView* t : {&e->shared_gate, &e->shared_up, &e->shared_down})
        pc.add("shared_experts", *t);
      for (const TensorView* t : {&e->latent_down, &e->latent_norm, &e->latent_up})
        pc.add("latent_projections", *t);
    }
  }
  return pc;
}

nlohmann::json weights_json(const ModelWeights& w) {
  const BindReport& r = w.report;
  nlohmann::json j;
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : w.files) files.push_back(f->path());
  j["files"] = files;
  j["bytes_mapped"] = r.bytes_mapped;
  j["tensors_in_files"] = r.tensors_in_files;
  j["tensors_bound"] = r.tensors_bound;
  j["missing_tensors"] = 0;  // any missing tensor fails the load
  j["extra_tensors"] = r.extra_tensors;
  j["extra_examples"] = r.extra_examples;
  j["params_by_dtype"] = r.params_by_dtype;
  j["bytes_by_dtype"] = r.bytes_by_dtype;
  int64_t stored = 0, bytes = 0;
  for (const auto& [k, v] : r.params_by_dtype) stored += v;
  for (const auto& [k, v] : r.bytes_by_dtype) bytes += v;
  j["stored_elements"] = stored;
  j["bytes_bound"] = bytes;
  const ParamCounter pc = count_params(w);
  int64_t logical = 0;
  nlohmann::json parts = nlohmann::json::object();
  for (const auto& [name, c] : pc.parts()) {
    parts[name] = {{"params", c.logical}, {"bytes", c.bytes}};
    logical += c.logical;
  }
  j["params"] = logical;
  j["params_by_part"] = parts;
  return j;
}

std::string human_bytes(int64_t b) {
  char buf[64];
  const double v = static_cast<double>(b);
  if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2f MB", v / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.1f kB", v / 1e3);
  return buf;
}

void print_weights(const nlohmann::json& j) {
  std::printf("\nweights       %zu file(s), %s mapped\n", j["files"].size(),
              human_bytes(j["bytes_mapped"].get<int64_t>()).c_str());
  for (const auto& f : j["files"]) std::printf("  %s\n", f.get<std::string>().c_str());
  std::printf("tensors       %lld in files, %lld bound, 0 missing, %lld extra\n",
              static_cast<long long>(j["tensors_in_files"].get<int64_t>()),
              static_cast<long long>(j["tensors_bound"].get<int64_t>()),
              static_cast<long long>(j["extra_tensors"].get<int64_t>()));
  for (const auto& e : j["extra_examples"])
    std::printf("  extra: %s\n", e.get<std::string>().c_str());
  std::printf("params        %lld (%s bound)\n", static_cast<long long>(j["params"].get<int64_t>()),
              human_bytes(j["bytes_bound"].get<int64_t>()).c_str());
  std::printf("%-14s %16s %14s\n", "dtype", "elements", "bytes");
  for (const auto& [dt, n] : j["params_by_dtype"].items())
    std::printf("%-14s %16lld %14lld\n", dt.c_str(), static_cast<long long>(n.get<int64_t>()),
                static_cast<long long>(j["bytes_by_dtype"][dt].get<int64_t>()));
  std::printf("%-20s %16s %14s\n", "part", "params", "bytes");
  for (const auto& [part, c] : j["params_by_part"].items())
    std::printf("%-20s %16lld %14lld\n", part.c_str(),
                static_cast<long long>(c["params"].get<int64_t>()),
                static_cast<long long>(c["bytes"].get<int64_t>()));
}

struct InspectArgs {
  std::string model_dir;
  std::string config;
  bool json = false;
};

int run_inspect(const InspectArgs& a) {
  if (a.model_dir.empty() == a.config.empty())
    return fail("inspect: give exactly one of MODEL_DIR or --config FILE");
  if (!a.config.empty()) {
    auto cfg = load_model_config(a.config);
    if (!cfg) return fail(cfg.status().to_string());
    if (a.json) {
      std::cout << schedule_json(*cfg).dump(2) << "\n";
    } else {
      print_schedule(*cfg);
    }
    return 0;
  }
  // A model directory: everything run, generate and chat will need (check/model_check.h).
  auto checked = check_model_dir(a.model_dir);
  if (!checked) return fail(checked.status().to_string());
  const ModelWeights* w = &checked->weights;
  nlohmann::json wj = weights_json(*w);
  nlohmann::json tj = nullptr;  // null: no tokenizer in the directory
  if (const auto& t = checked->tokenizer) {
    tj = {{"path", t->path},
          {"ranks", t->ranks},
          {"vocab_size", t->vocab_size},
          {"control_tokens", t->control_token_source}};
    for (const auto& [name, id] : t->chat_tokens) tj["chat_tokens"][name] = id;
  }
  if (a.json) {
    nlohmann::json j = schedule_json(w->config);
    j["model_dir"] = a.model_dir;
    j["weights"] = wj;
    j["params"] = wj["params"];
    j["params_by_dtype"] = wj["params_by_dtype"];
    j["bytes_by_dtype"] = wj["bytes_by_dtype"];
    j["extra_tensors"] = wj["extra_tensors"];
    j["plan_buffers"] = checked->plan_buffers;
    j["tokenizer"] = tj;
    std::cout << j.dump(2) << "\n";
  } else {
    print_schedule(w->config);
    print_weights(wj);
    std::printf("plan          planned storage: %d [T, d] buffers, no hazard\n",
                checked->plan_buffers);
    if (tj.is_null()) {
      std::printf("tokenizer     none in the directory (generate and chat need --tokenizer)\n");
    } else {
      std::printf(
          "tokenizer     %s: %lld ranks, ids < %lld (vocab_size %lld), control tokens "
          "from %s\n",
          tj["path"].get<std::string>().c_str(), static_cast<long long>(tj["ranks"].get<int64_t>()),
          static_cast<long long>(tj["vocab_size"].get<int64_t>()),
          static_cast<long long>(w->config.vocab_size),
          tj["control_tokens"].get<std::string>().c_str());
    }
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
