#include "runtime/generation.h"

#include <algorithm>
#include <cmath>

namespace attnres {

Generation::Generation(const GenerationRequest& request, const Tokenizer* tokenizer,
                       std::span<const int32_t> model_stops, int64_t vocab_size)
    : request_(request), sampler_(request.sampling, vocab_size) {
  if (!request.ignore_eos) stop_ids_.assign(model_stops.begin(), model_stops.end());
  stop_ids_.insert(stop_ids_.end(), request.stop_tokens.begin(), request.stop_tokens.end());
  if (tokenizer != nullptr)
    streamer_ = std::make_unique<TokenStreamer>(*tokenizer, stop_ids_, request.stop_strings,
                                                /*exact_stop_ids=*/true);
  history_ = request.prompt;
  biased_.resize(static_cast<size_t>(vocab_size));
}

namespace {

// Log softmax of the raw logits in double: the chosen token's and the top n, most likely first
// (ties: lower id first).
void fill_logprobs(std::span<const float> logits, int top_n, TokenEvent& ev) {
  double mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  const double lse = mx + std::log(sum);
  ev.logprob = static_cast<float>(static_cast<double>(logits[static_cast<size_t>(ev.token)]) - lse);
  if (top_n <= 0) return;
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  const size_t n = std::min(ids.size(), static_cast<size_t>(top_n));
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(),
                    [&](int32_t a, int32_t b) {
                      const float la = logits[static_cast<size_t>(a)];
                      const float lb = logits[static_cast<size_t>(b)];
                      return la > lb || (la == lb && a < b);
                    });
  for (size_t i = 0; i < n; ++i)
    ev.top.push_back({ids[i], static_cast<float>(logits[static_cast<size_t>(ids[i])] - lse)});
}

}  // namespace

Result<int32_t> Generation::choose(std::span<const float> logits, const std::string& where,
                                   TokenEvent& ev) {
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(logits[i])) {
      return Status(ErrorCode::kInternal, "the model produced a non-finite logit (" +
                                              std::to_string(logits[i]) + " for token " +
                                              std::to_string(i) + ") " + where);
    }
  }
  const size_t g = generated_.size();
  int32_t token = 0;
  if (g < request_.forced_tokens.size()) {
    token = request_.forced_tokens[g];
  } else if (request_.logit_bias.empty()) {
    token = sampler_.sample(logits, history_);
  } else {
    std::copy(logits.begin(), logits.end(), biased_.begin());
    for (const auto& [id, bias] : request_.logit_bias) biased_[static_cast<size_t>(id)] += bias;
    token = sampler_.sample(biased_, history_);
  }
  ev.token = token;
  if (request_.top_logprobs >= 0) fill_logprobs(logits, request_.top_logprobs, ev);
  return token;
}

Status Generation::accept(int32_t token, TokenEvent& ev) {
  history_.push_back(token);
  generated_.push_back(token);
  if (streamer_) {
    ATTNRES_ASSIGN_OR_RETURN(ev.text, streamer_->push(token));
    if (streamer_->stopped()) {
      const bool by_string = streamer_->stop_reason() == "string";
      reason_ = by_string ? FinishReason::kStopString : FinishReason::kStopToken;
      if (by_string) stop_string_ = streamer_->matched_stop_string();
    }
  } else if (std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) {
    reason_ = FinishReason::kStopToken;
  }
  return Status::ok();
}

std::string Generation::finish_text() {
  return streamer_ ? streamer_->finish() : std::string();
}

}  // namespace attnres
