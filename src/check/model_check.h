// Checking a model directory for everything `run`, `generate` and `chat` will need, before they
// run (`attnres inspect MODEL_DIR` and the fuzz_model_dir fuzzer).
//
// Contract: check_model_dir() loads the directory the way those commands do and fails with the
// first problem they would hit, as a Status naming the file, field or tensor:
//   - config.json validates (config/config.h: types, ranges, the kernels' table limits);
//   - every tensor binds with the config's dtype and shape (io/weights.h);
//   - the forward step's `planned` storage plan verifies without a hazard and its reads fit the
//     AttnRes kernels (the executor refuses both at session creation);
//   - when MODEL_DIR/tiktoken.model exists (the tokenizer `generate` and `chat` load by
//     default): it loads with Kimi's pre-tokenizer, its tokenizer_config.json when present
//     parses, no token id reaches the model's vocab_size, and the chat control tokens
//     (<|open|>, <|close|>, <|sep|>, <|end_of_msg|>) exist.
// A directory without a tokenizer passes (run needs none; generate and chat then need
// --tokenizer). Thread-safety: none needed (no shared state).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "io/weights.h"
#include "util/status.h"

namespace attnres {

struct TokenizerFacts {
  std::string path;  // the rank file
  int64_t ranks = 0;
  int64_t vocab_size = 0;  // one more than the largest id (ranks and control tokens)
  std::string control_token_source;
  std::vector<std::pair<std::string, int64_t>> chat_tokens;  // name, id
};

struct ModelCheck {
  ModelWeights weights;
  int plan_buffers = 0;  // [T, d] buffers of the planned storage
  std::optional<TokenizerFacts> tokenizer;
};

Result<ModelCheck> check_model_dir(const std::string& model_dir);

// The tokenizer part alone, against a loaded config: `path` is a rank file or a directory
// holding one.
Result<TokenizerFacts> check_tokenizer(const std::string& path, const ModelConfig& config);

}  // namespace attnres
