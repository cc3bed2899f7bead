// attnres harness: the 93-layer lifetime harness (plan/harness.h). Runs the forward program
// with stand-in sublayers under every storage policy, compares planned and preserve-final
// bitwise against separate (final output and bank), checks that unrestricted changes the
// output, and reports verifier findings, wall time and memory per policy. Exit status 1 when an
// expectation fails.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "command.h"
#include "plan/harness.h"
#include "plan/plan_json.h"

namespace attnres::cli {
namespace {

struct HarnessArgs {
  HarnessOptions o;
  std::string dtype = "bf16";
  bool json = false;
};

// The 1-minute load average (/proc/loadavg), so recorded timings carry their context; -1 if
// unavailable.
double load_average() {
  std::ifstream f("/proc/loadavg");
  double l = -1;
  if (!(f >> l)) return -1;
  return l;
}

std::string join_counts(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

int run_harness_cmd(HarnessArgs& a) {
  if (a.dtype == "bf16") {
    a.o.dtype = ActDType::kBF16;
  } else if (a.dtype == "f32") {
    a.o.dtype = ActDType::kF32;
  } else {
    return fail("--dtype: expected bf16 or f32, got '" + a.dtype + "'");
  }
  const double load_before = load_average();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_harness(a.o);
  if (!r.is_ok()) return fail(r.status().to_string());
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const HarnessResult& h = *r;
  const double load_after = load_average();
  if (a.json) {
    nlohmann::json j;
    j["layers"] = a.o.layers;
    j["block"] = a.o.block;
    j["tokens"] = a.o.tokens;
    j["hidden"] = a.o.hidden;
    j["dtype"] = a.dtype;
    j["kernel_target"] = h.kernel_target;
    j["output_elements"] = h.output_elements;
    j["bank_elements"] = h.bank_elements;
    j["reps"] = a.o.reps;
    j["lower_bound_buffers"] = h.lower_bound_buffers;
    j["ok"] = h.ok();
    j["failures"] = h.failures;
    j["total_seconds"] = total;
    j["load_average"] = {load_before, load_after};
    nlohmann::json pols = nlohmann::json::object();
    for (const auto& [p, pr] : h.policies) {
      pols[std::string(policy_name(p))] = {{"output_mismatches", pr.output_mismatches},
                                           {"bank_mismatches", pr.bank_mismatches},
                                           {"hazards", hazards_json(pr.hazards)},
                                           {"seconds", pr.seconds},
                                           {"seconds_per_rep", pr.seconds_per_rep},
                                           {"buffers", pr.buffers},
                                           {"peak_bytes", pr.peak_bytes},
                                           {"rss_peak_bytes", pr.rss_peak_bytes}};
    }
    j["policies"] = pols;
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("lifetime harness: %d layers, block %d, [%lld, %lld] %s, %d rep(s), kernel %s\n",
                a.o.layers, a.o.block, static_cast<long long>(a.o.tokens),
                static_cast<long long>(a.o.hidden), a.dtype.c_str(), a.o.reps,
                h.kernel_target.c_str());
    std::printf(
        "compared per rep: %lld output elements, %lld bank elements; lower bound %d "
        "buffers\n\n",
        static_cast<long long>(h.output_elements), static_cast<long long>(h.bank_elements),
        h.lower_bound_buffers);
    std::printf("%-15s %8s %10s %13s %9s  %-28s %s\n", "policy", "buffers", "arena MiB",
                "peak RSS MiB", "seconds", "output mismatches", "bank mismatches");
    for (const auto& [p, pr] : h.policies) {
      std::printf("%-15s %8d %10.1f %13.1f %9.2f  %-28s %s\n", std::string(policy_name(p)).c_str(),
                  pr.buffers, static_cast<double>(pr.peak_bytes) / (1 << 20),
                  static_cast<double>(pr.rss_peak_bytes) / (1 << 20), pr.seconds,
                  join_counts(pr.output_mismatches).c_str(),
                  join_counts(pr.bank_mismatches).c_str());
    }
    std::printf("\n(mismatches per rep against separate; separate against its first rep)\n");
    for (const auto& [p, pr] : h.policies) {
      std::printf("verifier %-15s %zu hazard(s)\n", std::string(policy_name(p)).c_str(),
                  pr.hazards.size());
      for (const Hazard& hz : pr.hazards) std::printf("  %s\n", format_hazard(hz).c_str());
    }
    std::printf("\ntotal %.1f s (1-min load average %.2f before, %.2f after): %s\n", total,
                load_before, load_after, h.ok() ? "OK" : "FAILED");
    for (const std::string& f : h.failures) std::printf("  FAILED: %s\n", f.c_str());
  }
  return h.ok() ? 0 : 1;
}

const CommandRegistration kReg(
    "harness", "Run the AttnRes lifetime harness under every storage policy",
    [](CLI::App* sub) -> CommandRun {
      auto a = std::make_shared<HarnessArgs>();
      sub->add_option("--layers", a->o.layers, "Decoder layers")->capture_default_str();
      sub->add_option("--block", a->o.block, "AttnRes block size (0 = plain residual)")
          ->capture_default_str();
      sub->add_option("--tokens", a->o.tokens, "Tokens T")->capture_default_str();
      sub->add_option("--hidden", a->o.hidden, "Hidden size d")->capture_default_str();
      sub->add_option("--reps", a->o.reps, "Repetitions")->capture_default_str();
      sub->add_option("--dtype", a->dtype, "Activation storage: bf16 or f32")
          ->capture_default_str();
      sub->add_flag("--json", a->json, "Machine-readable output");
      return [a] { return run_harness_cmd(*a); };
    });

}  // namespace
}  // namespace attnres::cli
