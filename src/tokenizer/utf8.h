// UTF-8 helpers for the tokenizer: validation, lossy decoding and a streaming decoder.
//
// Contract: decoding replaces every ill-formed sequence by U+FFFD using the Unicode "maximal
// subpart" practice (Unicode 15 §3.9, U+FFFD substitution), which is also what Python's
// bytes.decode(errors="replace") and the WHATWG TextDecoder do — so text decoded here matches
// tiktoken's decode(). Utf8StreamDecoder produces exactly the same text as utf8_lossy() of the
// concatenated input, but emits it incrementally: it only ever holds back the trailing bytes of
// a sequence that is still incomplete and could become valid (at most 3 bytes).
//
// Thread-safety: free functions are pure; a Utf8StreamDecoder is single-threaded state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace attnres {

// Status of the UTF-8 sequence starting at text[pos].
struct Utf8Step {
  uint32_t length;     // bytes consumed: the sequence, or the maximal ill-formed subpart
  uint32_t codepoint;  // valid only when ok
  bool ok;             // a well-formed scalar value
  bool truncated;      // ill-formed only because the text ends (more bytes could complete it)
};
Utf8Step utf8_step(std::string_view text, size_t pos);

bool utf8_valid(std::string_view text);
// Ill-formed subparts replaced by U+FFFD.
std::string utf8_lossy(std::string_view bytes);
void append_utf8(uint32_t codepoint, std::string& out);
// Python str.isspace() for one code point: bidirectional class WS, B or S, or category Zs.
bool python_isspace(uint32_t codepoint);

class Utf8StreamDecoder {
 public:
  // Returns the text that is complete after appending `bytes`.
  std::string push(std::string_view bytes);
  // End of stream: a held incomplete sequence becomes one U+FFFD.
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }
  void reset() { pending_.clear(); }

 private:
  std::string pending_;  // [<= 3] bytes of an incomplete, so-far-valid sequence
};

}  // namespace attnres
