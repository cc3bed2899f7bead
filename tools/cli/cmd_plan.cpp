// attnres plan: the storage plan of one forward step for a config. Prints the lifetime table
// (value, defining step, last reader, storage) of one policy, the [T, d] buffers and bytes of
// every policy, the liveness lower bound and the verifier's findings. Exit status 1 when the
// planned policy fails its guarantees (a hazard, or more buffers than the lower bound).
// With --ranks P: tensor parallelism on P ranks (docs/parallel.md): per rank the weight bytes
// (and the replicated part, and the copies made of them at load), the weights read per decoded
// token, the KDA state and latent-cache bytes per sequence at T tokens, the activation storage; and
// the gathers and gathered bytes per decoded token.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "command.h"
#include "config/config.h"
#include "model/tp_plan.h"
#include "plan/executor.h"
#include "plan/plan.h"
#include "plan/plan_json.h"
#include "plan/program.h"

namespace attnres::cli {
namespace {

struct PlanArgs {
  std::string config;
  int64_t tokens = 0;
  int64_t max_sequences = 0;  // with prefill_chunk: the batched engine's step budget
  int64_t prefill_chunk = 0;
  std::string policy = "planned";
  std::string dtype = "bf16";
  int ranks = 0;
  bool json = false;
};

// The tensor-parallel section (--ranks): JSON, and text when `print`.
nlohmann::json tp_section(const ModelConfig& c, const PlanArgs& a, int64_t activation_bytes,
                          bool print) {
  const bool bf16 = a.dtype == "bf16";
  const std::vector<TpRankPlan> ranks = tp_rank_plans(c, a.ranks);
  const TpTraffic t = tp_decode_traffic(c, a.ranks, bf16);
  // The latent cache is per token and shared by every head: every rank holds all of it.
  const int64_t cache_bytes =
      a.tokens * c.schedule.num_mla * (c.kv_lora_rank + c.qk_rope_head_dim) * (bf16 ? 2 : 4);
  nlohmann::json j;
  j["ranks"] = a.ranks;
  j["gathers_per_token"] = t.gathers;
  j["gather_bytes_per_token"] = t.gather_bytes;
  j["control_collectives_per_token"] = t.control;
  j["gathers_per_layer"] = {
      {"kda", t.kda}, {"mla", t.mla}, {"moe", t.moe}, {"dense", t.dense}, {"lm_head", t.lm_head}};
  j["latent_cache_bytes_per_sequence"] = cache_bytes;
  j["activation_storage_bytes"] = activation_bytes;
  nlohmann::json rows = nlohmann::json::array();
  for (const TpRankPlan& r : ranks)
    rows.push_back({{"rank", r.rank},
                    {"weight_bytes", r.weight_bytes},
                    {"replicated_bytes", r.replicated_bytes},
                    {"copy_bytes", r.copy_bytes},
                    {"weights_read_per_token", r.read_bytes_per_token},
                    {"kda_state_bytes_per_sequence", r.kda_state_bytes}});
  j["per_rank"] = rows;
  if (!print) return j;
  const auto gb = [](int64_t b) { return static_cast<double>(b) / 1e9; };
  std::printf("\ntensor parallelism on %d ranks (%s activations, %lld tokens per sequence):\n",
              a.ranks, a.dtype.c_str(), static_cast<long long>(a.tokens));
  std::printf("%6s %14s %14s %10s %18s %16s %16s %14s\n", "rank", "weights GB", "replicated GB",
              "copies GB", "read/token GB", "KDA state MB", "latent cache MB", "activations MB");
  for (const TpRankPlan& r : ranks)
    std::printf("%6d %14.3f %14.3f %10.3f %18.3f %16.2f %16.2f %14.2f\n", r.rank,
                gb(r.weight_bytes), gb(r.replicated_bytes), gb(r.copy_bytes),
                gb(r.read_bytes_per_token), static_cast<double>(r.kda_state_bytes) / 1e6,
                static_cast<double>(cache_bytes) / 1e6,
                static_cast<double>(activation_bytes) / 1e6);
  std::printf(
      "per decoded token: %lld gathers (per layer: KDA %d, MLA %d, MoE %d, dense %d; lm_head %d) "
      "+ %lld control broadcast, %.2f MB gathered\n",
      static_cast<long long>(t.gathers), t.kda, t.mla, t.moe, t.dense, t.lm_head,
      static_cast<long long>(t.control), static_cast<double>(t.gather_bytes) / 1e6);
  return j;
}

int run_plan(PlanArgs a) {
  // A batched step holds one row per decoding sequence plus one prefill chunk (the engine's
  // token budget, include/attnres/engine.h): its plan is the same program over that many rows.
  if (a.max_sequences != 0 || a.prefill_chunk != 0) {
    if (a.max_sequences < 1 || a.prefill_chunk < 1)
      return fail("--max-sequences and --prefill-chunk go together and must be >= 1, got " +
                  std::to_string(a.max_sequences) + " and " + std::to_string(a.prefill_chunk));
    if (a.tokens != 0)
      return fail("give --tokens or --max-sequences with --prefill-chunk, not both");
    a.tokens = a.max_sequences + a.prefill_chunk;
    if (!a.json)
      std::printf(
          "batched step budget: %lld rows (%lld decode rows + a %lld-token prefill chunk)\n",
          static_cast<long long>(a.tokens), static_cast<long long>(a.max_sequences),
          static_cast<long long>(a.prefill_chunk));
  }
  const auto policy = parse_policy(a.policy);
  if (!policy) {
    return fail("--policy: expected separate, unrestricted, preserve-final or planned, got '" +
                a.policy + "'");
  }
  if (a.dtype != "bf16" && a.dtype != "f32") {
    return fail("--dtype: expected bf16 or f32, got '" + a.dtype + "'");
  }
  if (a.tokens < 1) return fail("--tokens: expected >= 1, got " + std::to_string(a.tokens));
  if (a.ranks < 0 || a.ranks > 65536)
    return fail("--ranks: expected 1..65536, got " + std::to_string(a.ranks));
  auto cfg = load_model_config(a.config);
  if (!cfg.is_ok()) return fail(cfg.status().to_string());
  const Program program = build_program(cfg->schedule);
  const ActDType dt = a.dtype == "bf16" ? ActDType::kBF16 : ActDType::kF32;
  const int lb = lower_bound_buffers(program);
  // --tokens is unbounded and hidden_size large: every byte count printed is checked.
  int64_t buffer_bytes = 0;
  int64_t most_bytes = 0;  // the largest count printed: the most buffers of any policy
  int most_buffers = lb;
  for (Policy p : kAllPolicies)
    most_buffers = std::max(most_buffers, make_plan(program, p).num_storages());
  if (__builtin_mul_overflow(a.tokens, cfg->hidden_size, &buffer_bytes) ||
      __builtin_mul_overflow(buffer_bytes, static_cast<int64_t>(act_dtype_size(dt)),
                             &buffer_bytes) ||
      __builtin_mul_overflow(buffer_bytes, int64_t{most_buffers}, &most_bytes)) {
    return fail("--tokens " + std::to_string(a.tokens) + " x hidden_size " +
                std::to_string(cfg->hidden_size) + " (" + a.config + ") x " + a.dtype + " x " +
                std::to_string(most_buffers) + " buffers overflows a 64-bit byte count");
  }

  struct Row {
    Plan plan;
    std::vector<Hazard> hazards;
    int peak_live = 0;
  };
  std::map<Policy, Row> rows;
  for (Policy p : kAllPolicies) {
    Row r;
    r.plan = make_plan(program, p);
    auto h = verify_plan(program, r.plan);
    if (!h.is_ok()) return fail(h.status().to_string());
    r.hazards = std::move(*h);
    r.peak_live = peak_live_storages(program, r.plan);
    rows[p] = std::move(r);
  }
  const Row& planned = rows[Policy::kPlanned];
  std::vector<std::string> failures;
  if (!planned.hazards.empty()) failures.push_back("planned: verifier reports hazards");
  if (planned.plan.num_storages() != lb) {
    failures.push_back("planned: " + std::to_string(planned.plan.num_storages()) +
                       " buffers, lower bound " + std::to_string(lb));
  }
  const Row& sel = rows[*policy];

  if (a.json) {
    nlohmann::json j;
    j["config"] = a.config;
    j["layers"] = program.num_layers;
    j["attn_res_block_size"] = program.block_size;
    j["bank_slots"] = program.bank_slots;
    j["tokens"] = a.tokens;
    if (a.max_sequences > 0) {
      j["max_sequences"] = a.max_sequences;
      j["prefill_chunk"] = a.prefill_chunk;
    }
    j["hidden_size"] = cfg->hidden_size;
    j["dtype"] = a.dtype;
    j["buffer_bytes"] = buffer_bytes;
    j["lower_bound_buffers"] = lb;
    j["lower_bound_bytes"] = lb * buffer_bytes;
    j["policy"] = a.policy;
    nlohmann::json vals = nlohmann::json::array();
    for (size_t v = 0; v < program.values.size(); ++v) {
      const Value& val = program.values[v];
      vals.push_back(
          {{"value", val.name},
           {"kind", value_kind_name(val.kind)},
           {"def", program.step_name(val.def_step)},
           {"last_reader", program.step_name(val.last_reader())},
           {"storage", sel.plan.storages[static_cast<size_t>(sel.plan.storage_of[v])].name}});
    }
    j["values"] = vals;
    nlohmann::json pols = nlohmann::json::object();
    for (const auto& [p, r] : rows) {
      pols[std::string(policy_name(p))] = {{"peak_buffers", r.plan.num_storages()},
                                           {"peak_bytes", r.plan.num_storages() * buffer_bytes},
                                           {"peak_live_buffers", r.peak_live},
                                           {"hazards", hazards_json(r.hazards)}};
    }
    j["policies"] = pols;
    j["ok"] = failures.empty();
    j["failures"] = failures;
    if (a.ranks > 0)
      j["tensor_parallel"] =
          tp_section(*cfg, a, planned.plan.num_storages() * buffer_bytes, /*print=*/false);
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("config %s: %d layers, AttnRes block %d, %d bank slots\n", a.config.c_str(),
                program.num_layers, program.block_size, program.bank_slots);
    std::printf("one [T, d] buffer = [%lld, %lld] %s = %lld bytes\n\n",
                static_cast<long long>(a.tokens), static_cast<long long>(cfg->hidden_size),
                a.dtype.c_str(), static_cast<long long>(buffer_bytes));
    std::printf("lifetimes under '%s':\n%s\n", a.policy.c_str(),
                format_plan(program, sel.plan).c_str());
    std::printf("%-15s %8s %10s %16s %8s\n", "policy", "buffers", "live peak", "peak bytes",
                "hazards");
    for (const auto& [p, r] : rows) {
      std::printf("%-15s %8d %10d %16lld %8zu\n", std::string(policy_name(p)).c_str(),
                  r.plan.num_storages(), r.peak_live,
                  static_cast<long long>(r.plan.num_storages() * buffer_bytes), r.hazards.size());
    }
    std::printf("%-15s %8d %10s %16lld\n\n", "lower bound", lb, "",
                static_cast<long long>(lb * buffer_bytes));
    for (const auto& [p, r] : rows) {
      for (const Hazard& h : r.hazards) {
        std::printf("verifier: %s: %s\n", std::string(policy_name(p)).c_str(),
                    format_hazard(h).c_str());
      }
    }
    std::printf("planned: %s\n", failures.empty() ? "no hazard, peak == lower bound" : "FAILED");
    for (const std::string& f : failures) std::printf("  FAILED: %s\n", f.c_str());
    if (a.ranks > 0)
      (void)tp_section(*cfg, a, planned.plan.num_storages() * buffer_bytes, /*print=*/true);
  }
  return failures.empty() ? 0 : 1;
}

const CommandRegistration kReg(
    "plan", "Plan a forward step's activation storage and verify every policy",
    [](CLI::App* sub) -> CommandRun {
      auto a = std::make_shared<PlanArgs>();
      sub->add_option("--config", a->config, "Model config.json")->required();
      sub->add_option("--tokens", a->tokens, "Tokens T of the forward step");
      sub->add_option("--max-sequences", a->max_sequences,
                      "With --prefill-chunk: plan the batched engine's step (T = both summed)");
      sub->add_option("--prefill-chunk", a->prefill_chunk, "Prefill chunk of the batched step");
      sub->add_option("--policy", a->policy,
                      "Policy whose lifetime table is printed: separate, unrestricted, "
                      "preserve-final, planned")
          ->capture_default_str();
      sub->add_option("--dtype", a->dtype, "Activation storage: bf16 or f32")
          ->capture_default_str();
      sub->add_option("--ranks", a->ranks,
                      "Tensor parallelism: per-rank memory and gathers per token on P ranks");
      sub->add_flag("--json", a->json, "Machine-readable output");
      return [a] { return run_plan(*a); };
    });

}  // namespace
}  // namespace attnres::cli
