// Request bodies of the OpenAI-compatible routes, read into native types (no JSON past here).
//
// Contract: parse_*() take the raw body bytes and either return the request's fields, checked,
// or an ApiError whose message starts with the JSON path of the field at fault
// ("temperature: expected a number in [0, 2], found 3.5") and whose `param` is that path. Every
// client mistake is a 4xx (400, or 415 for a wrong content type); none throws. Fields other
// servers accept and this one ignores (`user`, `metadata`, `store`, `parallel_tool_calls`, ...)
// are ignored; unknown fields are ignored (clients send vendor extras). The chat template's own
// fields (`messages`, `tools`, `tool_choice`, `response_format`, `chat_template_kwargs`,
// `reasoning_effort`) are checked by parse_chat_request (src/tokenizer/chat.h) when the prompt
// is rendered; this file checks the sampling and output fields.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnres/engine.h"

namespace attnres::server {

struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string code;   // "" = null
  std::string param;  // "" = null
  std::string message;
};

ApiError api_error(int status, std::string message, std::string param = {}, std::string code = {});
// The HTTP error for an engine or template Status: kContextLengthExceeded is 400
// context_length_exceeded, kUnavailable 503, kInternal and I/O classes 500, the rest 400. The
// param is the message's leading path when it has one.
ApiError status_error(const Status& st);
// {"error": {"message", "type", "param", "code"}}
nlohmann::ordered_json error_json(const ApiError& e);

// What the checks need to know about the served model.
struct ApiLimits {
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  bool allow_forced_output = false;  // --test-forced-output
};

// Fields shared by chat and text completions.
struct GenerationFields {
  SamplingParams sampling;
  bool seed_given = false;
  std::optional<int64_t> max_tokens;  // max_completion_tokens, else max_tokens
  std::vector<std::string> stop;
  std::vector<std::pair<int32_t, float>> logit_bias;
  int top_logprobs = -1;  // -1: no logprobs
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool cache_prompt = true;    // llama-server's field: use the prefix store
  bool ignore_eos = false;     // vLLM's field
  std::string model;
  std::optional<std::string> forced_output;  // attnres_forced_output (test builds of serve)
};

struct ChatCompletionRequest {
  nlohmann::ordered_json body;  // for the chat template
  GenerationFields gen;
};

struct CompletionRequest {
  GenerationFields gen;
  std::optional<std::string> prompt_text;  // a string prompt
  std::vector<int32_t> prompt_ids;         // a token-id prompt
  bool echo = false;
};

struct TokenizeRequest {
  std::optional<std::string> text;                  // `content` or `prompt`
  std::optional<nlohmann::ordered_json> chat_body;  // `messages`: the rendered chat prompt
  bool allow_special = false;                       // `add_special` / `parse_special`
  bool with_pieces = false;
};

struct DetokenizeRequest {
  std::vector<int32_t> tokens;
};

// One of these or an error.
template <typename T>
struct Parsed {
  std::optional<T> value;
  ApiError error;
  bool ok() const { return value.has_value(); }
};

// The body as a JSON object (415 unless `content_type` is application/json, or empty: curl
// without -H sends application/x-www-form-urlencoded, which is refused).
Parsed<nlohmann::ordered_json> parse_json_body(std::string_view content_type,
                                               std::string_view body);

Parsed<ChatCompletionRequest> parse_chat_completion(const nlohmann::ordered_json& body,
                                                    const ApiLimits& limits);
Parsed<CompletionRequest> parse_completion(const nlohmann::ordered_json& body,
                                           const ApiLimits& limits);
Parsed<TokenizeRequest> parse_tokenize(const nlohmann::ordered_json& body);
Parsed<DetokenizeRequest> parse_detokenize(const nlohmann::ordered_json& body,
                                           const ApiLimits& limits);

// Whether `header` (an Authorization value) is "Bearer KEY"; the comparison takes the same time
// whatever the bytes, so the key cannot be guessed byte by byte.
bool bearer_matches(std::string_view header, std::string_view key);

}  // namespace attnres::server
