// Stop strings and the token-to-text streamer; see stop.h for the contract.
#include "tokenizer/stop.h"

#include <algorithm>

namespace attnres {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStringMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_.append(text);
  // Earliest complete stop string (the longest one on a tie at the same position).
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);
    if (at != std::string::npos && (at < best || (at == best && s.size() > best_stop->size()))) {
      best = at;
      best_stop = &s;
    }
  }
  if (best_stop != nullptr) {
    stopped_ = true;
    matched_ = *best_stop;
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold the longest tail that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

std::string StopStringMatcher::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(held_);
  return out;
}

TokenStreamer::TokenStreamer(const Tokenizer& tokenizer, std::vector<TokenId> stop_ids,
                             std::vector<std::string> stop_strings, bool exact_stop_ids)
    : tokenizer_(&tokenizer), stop_ids_(std::move(stop_ids)), strings_(std::move(stop_strings)) {
  if (stop_ids_.empty() && !exact_stop_ids) {
    const TokenId eom = tokenizer.special_id(kEndOfMsgToken);
    if (eom >= 0) stop_ids_.push_back(eom);
  }
}

Result<std::string> TokenStreamer::push(TokenId id) {
  if (stopped()) return std::string();
  if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
    stopped_ = true;
    std::string out = strings_.push(utf8_.flush());
    if (!strings_.stopped()) out += strings_.flush();
    return out;
  }
  ATTNRES_ASSIGN_OR_RETURN(std::string_view bytes, tokenizer_->token_bytes(id));
  return strings_.push(utf8_.push(bytes));
}

std::string TokenStreamer::finish() {
  if (stopped()) return {};
  std::string out = strings_.push(utf8_.flush());
  if (!strings_.stopped()) out += strings_.flush();
  return out;
}

std::string_view TokenStreamer::stop_reason() const {
  if (strings_.stopped()) return "string";
  if (stopped_) return "token";
  return "";
}

}  // namespace attnres
