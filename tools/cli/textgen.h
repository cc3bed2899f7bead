// Text generation shared by the `generate` and `chat` front ends: loads a model and its
// tokenizer, prefills new prompt tokens into a session, samples, and streams decoded text.
//
// Contract: generate_text() appends `prompt` to the session (whose earlier tokens stay as
// context), then samples up to max_new_tokens, stopping at a stop token (<|end_of_msg|> and the
// config's eos), a stop string, the context limit (max_position_embeddings) or when `cancel`
// becomes true (checked before every decode step). A prompt that does not fit in the context is
// a kInvalidArgument error naming both lengths. Stop tokens are fed to the session (so a chat
// history stays consistent) but not shown.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "io/weights.h"
#include "kernels/sampling.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace attnres::cli {

struct TextGenOptions {
  SamplingParams sampling;
  int64_t max_new_tokens = 256;
  std::vector<std::string> stop_strings;
};

struct TextGenResult {
  std::vector<int32_t> tokens;  // generated ids (stop token included when one ended the turn)
  std::string text;             // what was shown
  std::string stop_reason;      // "token", "string", "length", "context" or "cancelled"
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

Result<TextGenResult> generate_text(Session& session, const Tokenizer& tokenizer,
                                    const ModelConfig& config, std::span<const int32_t> prompt,
                                    std::vector<int32_t>& history, const TextGenOptions& options,
                                    const std::function<void(std::string_view)>& on_text,
                                    const std::atomic<bool>* cancel = nullptr);

// Options every text front end shares: model, tokenizer, sampling, length, dtype.
struct TextModelArgs {
  std::string model;
  std::string tokenizer;  // default: MODEL/tiktoken.model
  std::string dtype = "bf16";
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
  bool progress = true;
};
void add_text_model_options(CLI::App* sub, TextModelArgs& a);

// A loaded model + tokenizer + session ready to generate.
struct TextModel {
  std::unique_ptr<ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Session> session;
  TextGenOptions options;
};
// Loads everything; shows loading progress on stderr when it is a terminal.
Result<TextModel> load_text_model(const TextModelArgs& a);

}  // namespace attnres::cli
