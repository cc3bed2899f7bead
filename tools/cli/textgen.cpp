#include "textgen.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "tokenizer/stop.h"

namespace attnres::cli {

Result<TextGenResult> generate_text(Session& session, const Tokenizer& tokenizer,
                                    const ModelConfig& config, std::span<const int32_t> prompt,
                                    std::vector<int32_t>& history, const TextGenOptions& options,
                                    const std::function<void(std::string_view)>& on_text,
                                    const std::atomic<bool>* cancel) {
  TextGenResult r;
  r.prompt_tokens = static_cast<int64_t>(prompt.size());
  const int64_t limit = config.max_position_embeddings.value_or(INT64_MAX);
  if (prompt.empty()) return Status(ErrorCode::kInvalidArgument, "the prompt encodes to no tokens");
  if (session.position() + r.prompt_tokens > limit)
    return Status(ErrorCode::kInvalidArgument,
                  "prompt of " + std::to_string(r.prompt_tokens) + " tokens (after " +
                      std::to_string(session.position()) +
                      " tokens of history) does not fit the model's context of " +
                      std::to_string(limit) + " tokens (max_position_embeddings)");
  for (int32_t id : prompt) {
    if (id < 0 || id >= config.vocab_size)
      return Status(ErrorCode::kInvalidArgument, "prompt token id " + std::to_string(id) +
                                                     " is outside the model's vocabulary of " +
                                                     std::to_string(config.vocab_size));
  }
  std::vector<TokenId> stop_ids;
  if (TokenId eom = tokenizer.special_id(kEndOfMsgToken); eom >= 0) stop_ids.push_back(eom);
  if (config.eos_token_id) stop_ids.push_back(static_cast<TokenId>(*config.eos_token_id));
  TokenStreamer streamer(tokenizer, stop_ids, options.stop_strings);
  Sampler sampler(options.sampling, config.vocab_size);

  std::vector<float> logits;
  const auto t0 = std::chrono::steady_clock::now();
  ATTNRES_RETURN_IF_ERROR(session.prefill(prompt, /*all_logits=*/false, logits));
  history.insert(history.end(), prompt.begin(), prompt.end());
  const auto t1 = std::chrono::steady_clock::now();
  r.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  r.stop_reason = "length";
  for (int64_t g = 0; g < options.max_new_tokens; ++g) {
    const int32_t next = sampler.sample(logits, history);
    r.tokens.push_back(next);
    history.push_back(next);
    ATTNRES_ASSIGN_OR_RETURN(std::string text, streamer.push(next));
    if (!text.empty()) {
      r.text += text;
      on_text(text);
    }
    // The chosen token always enters the session, so the history holds what was generated.
    if (streamer.stopped()) {
      ATTNRES_RETURN_IF_ERROR(session.decode(next, logits));
      r.stop_reason = std::string(streamer.stop_reason());
      break;
    }
    if (session.position() + 1 > limit) {
      r.stop_reason = "context";
      break;
    }
    if (cancel != nullptr && cancel->load()) {
      ATTNRES_RETURN_IF_ERROR(session.decode(next, logits));
      r.stop_reason = "cancelled";
      break;
    }
    logits.resize(static_cast<size_t>(config.vocab_size));
    ATTNRES_RETURN_IF_ERROR(session.decode(next, logits));
  }
  if (std::string tail = streamer.finish(); !tail.empty()) {
    r.text += tail;
    on_text(tail);
  }
  r.decode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return r;
}

void add_text_model_options(CLI::App* sub, TextModelArgs& a) {
  sub->add_option("--model", a.model, "Model directory (config.json + safetensors)")->required();
  sub->add_option("--tokenizer", a.tokenizer, "tiktoken.model (default: MODEL/tiktoken.model)");
  sub->add_option("--dtype", a.dtype, "Activation dtype: bf16 (default) or f32");
  sub->add_option("--max-new-tokens", a.max_new_tokens, "Most tokens to generate (default 256)");
  sub->add_option("--temperature", a.temperature, "Sampling temperature (0 = greedy, default)");
  sub->add_option("--top-k", a.top_k, "Keep the k most likely tokens (0 = off)");
  sub->add_option("--top-p", a.top_p, "Nucleus sampling mass (1 = off)");
  sub->add_option("--min-p", a.min_p, "Drop tokens below min_p x the top probability (0 = off)");
  sub->add_option("--repetition-penalty", a.repetition_penalty, "CTRL-style penalty (1 = off)");
  sub->add_option("--presence-penalty", a.presence_penalty, "OpenAI presence penalty (0 = off)");
  sub->add_option("--frequency-penalty", a.frequency_penalty, "OpenAI frequency penalty (0 = off)");
  sub->add_option("--seed", a.seed, "Sampling seed (same seed, same tokens)");
  sub->add_option("--stop", a.stop, "Stop string (repeatable)");
}

namespace {

bool stderr_is_terminal() {
  return isatty(STDERR_FILENO) == 1;
}

}  // namespace

Result<TextModel> load_text_model(const TextModelArgs& a) {
  if (a.dtype != "bf16" && a.dtype != "f32")
    return Status(ErrorCode::kInvalidArgument,
                  "--dtype is '" + a.dtype + "', expected bf16 or f32");
  TextModel tm;
  tm.options.max_new_tokens = a.max_new_tokens;
  tm.options.stop_strings = a.stop;
  SamplingParams& sp = tm.options.sampling;
  sp.temperature = a.temperature;
  sp.top_k = a.top_k;
  sp.top_p = a.top_p;
  sp.min_p = a.min_p;
  sp.repetition_penalty = a.repetition_penalty;
  sp.presence_penalty = a.presence_penalty;
  sp.frequency_penalty = a.frequency_penalty;
  sp.seed = a.seed;
  ATTNRES_RETURN_IF_ERROR(validate_sampling_params(sp));
  if (a.max_new_tokens < 1)
    return Status(ErrorCode::kInvalidArgument,
                  "--max-new-tokens is " + std::to_string(a.max_new_tokens) + ", expected >= 1");

  const bool show = a.progress && stderr_is_terminal();
  const auto t0 = std::chrono::steady_clock::now();
  if (show) std::fprintf(stderr, "loading %s ...", a.model.c_str());
  auto weights = load_model(a.model);
  if (!weights) {
    if (show) std::fprintf(stderr, "\n");
    return weights.status();
  }
  tm.weights = std::make_unique<ModelWeights>(std::move(weights).value());
  if (show) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t bound = 0;
    for (const auto& [dtype, bytes] : tm.weights->report.bytes_by_dtype) bound += bytes;
    std::fprintf(stderr, "\rloaded %s: %.2f GB mapped, %lld tensors (%.2f GB) bound in %.2f s\n",
                 a.model.c_str(), static_cast<double>(tm.weights->report.bytes_mapped) / 1e9,
                 static_cast<long long>(tm.weights->report.tensors_bound),
                 static_cast<double>(bound) / 1e9, s);
  }
  const std::string tok_path = a.tokenizer.empty() ? a.model + "/tiktoken.model" : a.tokenizer;
  auto tok = Tokenizer::load(tok_path, PreTokenizer::kKimi);
  if (!tok) return tok.status();
  tm.tokenizer = std::make_unique<Tokenizer>(std::move(tok).value());
  if (tm.tokenizer->vocab_size() > tm.weights->config.vocab_size)
    return Status(ErrorCode::kInconsistent, tok_path + ": tokenizer has " +
                                                std::to_string(tm.tokenizer->vocab_size()) +
                                                " ids but the model's vocab_size is " +
                                                std::to_string(tm.weights->config.vocab_size));
  SessionOptions so;
  so.forward.act = a.dtype == "f32" ? ActDType::kF32 : ActDType::kBF16;
  ATTNRES_ASSIGN_OR_RETURN(tm.session, Session::create(*tm.weights, so));
  return tm;
}

}  // namespace attnres::cli
