// Pre-tokenizer: splits text into the pieces that BPE encodes independently, with PCRE2.
//
// Three published patterns are supported, each spelled for PCRE2 so that it matches exactly
// what tiktoken's regex engine (Rust `regex`/`fancy-regex`) matches with the published spelling:
//   - kimi:        Kimi's pat_str (tokenization_kimi.py). Its class intersections
//                  `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]` become a per-character negative
//                  lookahead `(?:(?!\p{sc:Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])`, which admits
//                  exactly the characters of the intersection. `\p{Han}` is the Script property
//                  (as in Rust regex and Python `regex`), spelled `\p{sc:Han}` because PCRE2 reads
//                  a bare script name as Script_Extensions.
//   - o200k_base, cl100k_base: tiktoken's patterns.
// In all three, `\s`/`\S` are spelled as the explicit Unicode White_Space set (what Rust regex
// means by `\s`), so the result does not depend on how a PCRE2 version defines `\s`.
//
// Invalid UTF-8: the patterns are compiled with PCRE2_MATCH_INVALID_UTF, under which an
// ill-formed sequence matches nothing and no match crosses it. Every well-formed character is
// matched by some alternative of each pattern, so the only unmatched stretches are runs of
// ill-formed bytes; each such run is returned as a piece of its own (BPE then encodes its bytes).
// Text on either side of such a run splits exactly as it would on its own.
//
// Thread-safety: a Splitter is immutable after create() and may be shared between threads;
// match scratch is per thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace attnres {

enum class PreTokenizer { kKimi, kO200kBase, kCl100kBase };

std::string_view pretokenizer_name(PreTokenizer p);
Result<PreTokenizer> parse_pretokenizer(std::string_view name);
// The pattern as published (Rust regex syntax) and as compiled here (PCRE2 syntax).
std::string_view published_pattern(PreTokenizer p);
std::string_view pcre2_pattern(PreTokenizer p);

class Splitter {
 public:
  static Result<Splitter> create(PreTokenizer p);

  // Appends the pieces of `text` (views into it, covering it exactly, in order) to `pieces`.
  // Fails only if the regex engine reports an error (e.g. a resource limit).
  Status split(std::string_view text, std::vector<std::string_view>& pieces) const;

  PreTokenizer kind() const { return kind_; }

 private:
  struct Code;
  PreTokenizer kind_ = PreTokenizer::kKimi;
  std::shared_ptr<const Code> code_;
};

// Kimi's tokenizer (tokenization_kimi.py, encode) cuts the input before tiktoken sees it: into
// chunks of at most 400,000 characters, then each chunk wherever a run of whitespace or of
// non-whitespace characters (Python str.isspace) exceeds 25,000 characters. Each part is then
// encoded on its own. Characters are code points; an ill-formed subpart (utf8_step) counts as one
// non-space character. Returns views into `text`.
std::vector<std::string_view> kimi_chunks(std::string_view text, size_t max_chunk_chars = 400000,
                                          size_t max_run_chars = 25000);

}  // namespace attnres
