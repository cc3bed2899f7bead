// Streaming detokenization with stop conditions, for generate/chat front ends.
//
// StopStringMatcher: fed the decoded text as it streams, it returns what may be shown now. It
// holds back the longest tail that is still a prefix of some stop string, so a stop string split
// across tokens is never shown; when a stop string completes, the text before it is released,
// stopped() becomes true and everything after is dropped. flush() releases the held tail at the
// end of generation (no stop string matched).
//
// TokenStreamer: the whole path from token ids to display text. It decodes token bytes through a
// Utf8StreamDecoder (only complete UTF-8 reaches the screen; ill-formed bytes become U+FFFD),
// stops on any stop token id (`<|end_of_msg|>` by default; the stop token itself is not shown)
// and on the stop strings. Control tokens other than stop tokens are shown as their names.
//
// Thread-safety: single-threaded state objects.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace attnres {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops = {});
  std::string push(std::string_view text);
  std::string flush();
  bool stopped() const { return stopped_; }
  // The stop string that ended the stream (empty if none).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;  // non-empty strings only
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

class TokenStreamer {
 public:
  // An empty `stop_ids` means the tokenizer's <|end_of_msg|> (when it has one) unless
  // `exact_stop_ids`, which takes the list as given (empty: no stop token).
  TokenStreamer(const Tokenizer& tokenizer, std::vector<TokenId> stop_ids = {},
                std::vector<std::string> stop_strings = {}, bool exact_stop_ids = false);
  // Feeds one generated token; returns the text to show now. Unknown ids are an error.
  Result<std::string> push(TokenId id);
  // End of generation: the remaining text.
  std::string finish();
  bool stopped() const { return stopped_ || strings_.stopped(); }
  // Why the stream stopped: "token", "string" or "" (not stopped).
  std::string_view stop_reason() const;
  // The stop string that ended the stream (empty if none did).
  const std::string& matched_stop_string() const { return strings_.matched(); }

 private:
  const Tokenizer* tokenizer_;
  std::vector<TokenId> stop_ids_;
  Utf8StreamDecoder utf8_;
  StopStringMatcher strings_;
  bool stopped_ = false;
};

}  // namespace attnres
