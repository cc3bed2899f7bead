// Synthetic checkpoints in the published Kimi-K3 layout: config.json (top-level object with a
// `text_config`, MXFP4 `quantization_config`) plus safetensors with the published tensor names,
// storage dtypes and MXFP4 packing, filled with deterministic random weights. The loader reads
// them exactly like a published checkpoint; benchmarks and tests use them.
//
// Contract: the same (preset, seed) always produces byte-identical files. Weights are scaled so
// activations stay O(1) through the layers (projections ~ U with std 1/sqrt(fan_in), gains near
// 1, E8M0 scales chosen per block so MXFP4 rows have the same std). Files are written
// atomically (temporary file + rename); a directory that already holds a config.json or
// safetensors files is refused unless `overwrite` is set, so no user file is lost.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/status.h"

namespace attnres {

struct SynthPreset {
  std::string name;
  std::string description;
  nlohmann::json text_config;  // the fields a published text_config carries
  int64_t shard_bytes = 0;     // 0: one model.safetensors; else shards + index of about this size
};

// Known presets: "tiny" (tests: 7 layers, block 3, partial final block), "tp-odd" (like tiny
// with no tensor-parallel split dimension divisible by 3), "k3-mini" (the K3
// graph at ~2 GB: 20 layers, hidden 1024, block 6 -> 4 slots and a partial final block),
// "deep" (the published 93 layers and block 12 at hidden 64: KDA accuracy against float64).
std::vector<std::string> synth_preset_names();
Result<SynthPreset> synth_preset(const std::string& name);

struct SynthReport {
  int64_t tensors = 0;
  int64_t bytes = 0;
  int files = 0;                     // weight files written
  std::vector<std::string> removed;  // the previous checkpoint's files removed (overwrite)
};

// Where a write stands, for a progress display: every tensor is filled, then its file
// written; bytes_filled and bytes_written each run up to bytes_total.
struct SynthProgress {
  std::string_view stage;  // "filling", "writing" (a weight file), "written"
  int64_t bytes_total = 0, bytes_filled = 0, bytes_written = 0;
  int files_total = 0, files_done = 0;
};
using SynthProgressFn = std::function<void(const SynthProgress&)>;

// Writes config.json and the weights of `preset` into `out_dir` (created if needed). With
// `overwrite` every file a checkpoint of this writer consists of (config.json,
// model.safetensors, model.safetensors.index.json, model-NNNNN-of-NNNNN.safetensors,
// tiktoken.model, tokenizer_config.json) is replaced, and those the new model does not have
// are removed, so the directory loads exactly the new model; other files are left alone. Each
// of them must be a regular, writable file, not a link (io/output.h check_output_path).
// Without it a directory holding any of them or any *.safetensors is refused. config.json is
// written last. `progress`, when given, is called as tensors are filled and files written.
Result<SynthReport> write_synthetic_model(const SynthPreset& preset, const std::string& out_dir,
                                          uint64_t seed, bool overwrite = false,
                                          const SynthProgressFn& progress = nullptr);

}  // namespace attnres
