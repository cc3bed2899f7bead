// attnres make-model: write a synthetic checkpoint in the published layout (random weights,
// MXFP4 experts) for tests and benchmarks. Progress on stderr: an updating line on a terminal,
// otherwise a summary line at the end. --overwrite replaces a checkpoint in --out and removes
// the files of the previous one the new one does not have (synth/synth.h).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Progress on stderr: on a terminal one line updated in place (at most 5 times a second),
// cleared at the end; otherwise one summary line at the end.
class ProgressLine {
 public:
  explicit ProgressLine(std::string out) : out_(std::move(out)), tty_(isatty(STDERR_FILENO)) {}
  void update(const SynthProgress& p) {
    if (!tty_) return;
    const double now = seconds_since(t0_);
    if (now - shown_ < 0.2 && p.files_done < p.files_total) return;
    shown_ = now;
    const double total = 2.0 * static_cast<double>(p.bytes_total);
    const double done = static_cast<double>(p.bytes_filled + p.bytes_written);
    std::fprintf(
        stderr,
        "\rmake-model %s: %3.0f%% (%.2f of %.2f GB filled, %d of %d files written), %.0f s ",
        out_.c_str(), total > 0 ? 100.0 * done / total : 100.0,
        static_cast<double>(p.bytes_filled) / 1e9, static_cast<double>(p.bytes_total) / 1e9,
        p.files_done, p.files_total, now);
    std::fflush(stderr);
    dirty_ = true;
  }
  // On a terminal clears the updating line (stdout's summary follows); otherwise prints the
  // summary, the only progress output a log gets.
  void finish(const std::string& summary) {
    if (dirty_) std::fprintf(stderr, "\r\033[K");
    if (!tty_) std::fprintf(stderr, "make-model: %s\n", summary.c_str());
  }
  // Ends the updating line before an error message.
  void abort() {
    if (dirty_) std::fprintf(stderr, "\n");
  }
  double seconds() const { return seconds_since(t0_); }

 private:
  std::string out_;
  bool tty_;
  bool dirty_ = false;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  double shown_ = -1;
};

int run_make_model(const MakeModelArgs& a) {
  auto preset = synth_preset(a.preset);
  if (!preset) return fail(preset.status().to_string());
  ProgressLine line(a.out);
  auto report = write_synthetic_model(*preset, a.out, a.seed, a.overwrite,
                                      [&](const SynthProgress& p) { line.update(p); });
  if (!report) {
    line.abort();
    return fail(report.status().to_string());
  }
  const double secs = line.seconds();
  std::string removed;
  for (const std::string& f : report->removed) removed += (removed.empty() ? "" : ", ") + f;
  char numbers[128];
  std::snprintf(numbers, sizeof numbers, ": %.3f GB in %d weight file(s) in %.1f s",
                static_cast<double>(report->bytes) / 1e9, report->files, secs);
  line.finish("wrote " + a.out + numbers +
              (removed.empty() ? "" : "; removed the previous checkpoint's " + removed));
  if (a.json) {
    std::cout << nlohmann::json{{"preset", a.preset},
                                {"out", a.out},
                                {"seed", a.seed},
                                {"tensors", report->tensors},
                                {"bytes", report->bytes},
                                {"files", report->files},
                                {"removed", report->removed},
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
