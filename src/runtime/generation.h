// The per-request part of generation: choosing each token from a logits row (logit bias,
// penalties over the history, the seeded sampler, forced tokens for tests), its logprobs, and
// what the token does to the output (streaming detokenisation, stop tokens, stop strings).
// Everything that depends on the request lives here, with the request; the engine owns the
// model state and the batching.
//
// Reproducibility: a Generation draws from its own seeded sampler once per token, so the same
// request and the same logits give the same tokens whatever else the engine is running.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "attnres/engine.h"
#include "kernels/sampling.h"
#include "tokenizer/stop.h"

namespace attnres {

class Generation {
 public:
  // `model_stops`: the model's stop tokens (ignored with request.ignore_eos).
  Generation(const GenerationRequest& request, const Tokenizer* tokenizer,
             std::span<const int32_t> model_stops, int64_t vocab_size);

  // The next token from logits [V] (the row after the last absorbed token); fills event.token
  // and, when asked, its logprobs. Non-finite logits are an error naming `where`.
  Result<int32_t> choose(std::span<const float> logits, const std::string& where,
                         TokenEvent& event);
  // Records the chosen token: history, output text (event.text), stop conditions.
  Status accept(int32_t token, TokenEvent& event);
  // The text held back at the end (a partial stop string that never completed, an incomplete
  // UTF-8 sequence).
  std::string finish_text();

  bool stopped() const { return reason_.has_value(); }
  std::optional<FinishReason> reason() const { return reason_; }
  const std::string& stop_string() const { return stop_string_; }
  const std::vector<int32_t>& generated() const { return generated_; }
  const std::vector<int32_t>& history() const { return history_; }

 private:
  const GenerationRequest& request_;
  std::vector<int32_t> stop_ids_;
  Sampler sampler_;
  std::unique_ptr<TokenStreamer> streamer_;  // null without a tokenizer (then no text)
  std::vector<int32_t> history_;             // prompt + generated (the penalties' history)
  std::vector<int32_t> generated_;
  std::vector<float> biased_;  // [V] logits + logit_bias
  std::optional<FinishReason> reason_;
  std::string stop_string_;
};

}  // namespace attnres
