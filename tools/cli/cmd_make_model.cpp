// attnres make-model: write a synthetic checkpoint in the published layout (random weights,
// MXFP4 experts) for tests and benchmarks.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "synth/synth.h"

namespace attnres::cli {
namespace {

struct MakeModelArgs {
  std::string preset;
  std::string out;
  uint64_t seed = 1;
  bool overwrite = false;
  bool json = false;
};

int run_make_model(const MakeModelArgs& a) {
  auto preset = synth_preset(a.preset);
  if (!preset) return fail(preset.status().to_string());
  const auto t0 = std::chrono::steady_clock::now();
  auto report = write_synthetic_model(*preset, a.out, a.seed, a.overwrite);
  if (!report) return fail(report.status().to_string());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) {
    std::cout << nlohmann::json{{"preset", a.preset},     {"out", a.out},
                                {"seed", a.seed},         {"tensors", report->tensors},
                                {"bytes", report->bytes}, {"files", report->files},
                                {"seconds", secs}}
                     .dump(2)
              << "\n";
  } else {
    std::printf("wrote %s (%s): %lld tensors, %.3f GB in %d file(s), %.1f s\n", a.out.c_str(),
                preset->description.c_str(), static_cast<long long>(report->tensors),
                static_cast<double>(report->bytes) / 1e9, report->files, secs);
  }
  return 0;
}

const CommandRegistration kReg(
    "make-model", "Write a synthetic checkpoint in the published layout", [](CLI::App* sub) {
      auto a = std::make_shared<MakeModelArgs>();
      std::string presets;
      for (const auto& n : synth_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
      sub->add_option("--preset", a->preset, "Model preset (" + presets + ")")->required();
      sub->add_option("--out", a->out, "Output directory")->required();
      sub->add_option("--seed", a->seed, "Random seed (same seed, same bytes)");
      sub->add_flag("--overwrite", a->overwrite, "Replace an existing checkpoint in --out");
      sub->add_flag("--json", a->json, "Machine-readable summary");
      return CommandRun([a] { return run_make_model(*a); });
    });

}  // namespace
}  // namespace attnres::cli
