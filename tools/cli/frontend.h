// What the commands that run the model share (generate, chat, run, bench, perplexity, serve):
// the model and engine flags, the sampling flags, and running one request to its end with
// streamed text, Ctrl-C and prefill progress. They reach the engine only through the public
// API (include/attnres).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "attnres/engine.h"

namespace attnres::cli {

struct ModelArgs {
  std::string model;
  std::string tokenizer;  // default: MODEL/tiktoken.model
  std::string dtype = "bf16";
  std::string kv_dtype = "auto";
  int threads = 0;                 // 0: the physical cores this process may run on
  std::string kv_budget = "auto";  // bytes (K/M/G suffixes) or auto: a full context each
  int64_t ctx_size = 0;            // 0: the model's max_position_embeddings
  bool mmap = false;               // view the weights in the file mapping (ModelLoadOptions)
};
// --model, --tokenizer, --dtype, --kv-dtype, --threads, --kv-budget, --ctx-size, --mmap.
// Records `a` as
// `sub`'s model flags, which follower ranks use (model_args_of).
void add_model_options(CLI::App* sub, ModelArgs& a);
// --mmap alone (commands with their own model flags).
void add_mmap_flag(CLI::App* sub, bool& mmap);
// The model flags of a subcommand that loads a model (null: it loads none).
const ModelArgs* model_args_of(const CLI::App* sub);

// "123", "64M", "2G" (binary multiples) or "auto" (-1); errors name `flag`.
Result<int64_t> parse_bytes(const std::string& s, const char* flag);
// Applies --threads; errors name the flag.
Status apply_threads(int threads);
// Loads the model (progress on stderr when it is a terminal and `progress`).
Result<std::shared_ptr<const Model>> load_cli_model(const ModelArgs& a, bool need_tokenizer,
                                                    bool progress);
// The engine options --dtype and --kv-dtype ask for.
Result<EngineOptions> engine_options(const ModelArgs& a);

struct SamplingArgs {
  int64_t max_new_tokens = 256;
  float temperature = 0.0f;  // greedy unless asked
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0;
  std::vector<std::string> stop;
};
void add_sampling_options(CLI::App* sub, SamplingArgs& a);
// A request with these sampling values and stops (prompt left empty).
GenerationRequest sampling_request(const SamplingArgs& a);

// Runs `request` on `engine` to its end. `on_text` receives the text as it streams. While
// `cancel` becomes true the request is cancelled (between steps, so a long prefill stops after
// its current chunk). Long prefills show progress on stderr (an updating line on a terminal,
// a summary line otherwise) when `progress`.
Result<GenerationResult> run_request(Engine& engine, GenerationRequest request,
                                     const std::function<void(std::string_view)>& on_text,
                                     const std::atomic<bool>* cancel = nullptr,
                                     bool progress = true);

// The names the text commands report: "token", "string", "length", "context", "cancelled".
std::string_view stop_reason_name(FinishReason r);

bool stderr_is_terminal();

}  // namespace attnres::cli
