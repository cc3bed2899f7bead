// Tokenizer: tiktoken-compatible byte-level BPE with control (special) tokens.
//
// Contract:
//   - load(path, pre): `path` is a tiktoken.model file, or a directory holding one. The rank file
//     must be well-formed (see RankTable). Control tokens depend on the pre-tokenizer:
//       kimi        Kimi's layout (tokenization_kimi.py): 256 reserved ids directly after the
//                   base vocabulary (base = number of ranks). Names come from the
//                   `added_tokens_decoder` of a tokenizer_config.json next to the rank file when
//                   there is one, else from the built-in Kimi-K3 table (kimi_k3_control_tokens);
//                   an unnamed slot i is "<|reserved_token_i|>".
//       o200k_base, cl100k_base  tiktoken's published special tokens of that encoding.
//   - encode(text, allow_special): with allow_special, every occurrence of a control token's
//     text becomes that token (leftmost first; the longest name wins at one position); without
//     it the whole text is ordinary text, so control-token names are encoded as plain bytes
//     (this is how chat user text must be encoded). Invalid UTF-8 is encoded as bytes (see
//     pretokenizer.h). With the kimi pre-tokenizer the text is first cut as Kimi's encode() does
//     (kimi_chunks). Valid UTF-8 text gives exactly tiktoken's ids.
//   - decode_bytes(ids) concatenates token bytes (control tokens give their text); decode(ids)
//     additionally replaces ill-formed UTF-8 with U+FFFD. An id that is neither a rank nor a
//     control token is an error naming the id.
//
// Thread-safety: a loaded Tokenizer is immutable; encode/decode may run concurrently.
#pragma once

#include <array>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "util/status.h"

namespace attnres {

struct SpecialToken {
  std::string text;
  TokenId id;
};

// Number of reserved control-token ids after Kimi's base vocabulary.
inline constexpr int kKimiReservedTokens = 256;

// Kimi-K3 control tokens as (offset from the base vocabulary, name): only the names whose ids
// are established (k3-model.md §7 and the published tokenizer_config.json); others come from a
// tokenizer_config.json when present. With the published 163,584 ranks, offset 0 is id 163584.
std::span<const std::pair<int, std::string_view>> kimi_k3_control_tokens();

// Names of the chat-format control tokens (k3-model.md §7).
inline constexpr std::string_view kBosToken = "[BOS]";
inline constexpr std::string_view kEosToken = "[EOS]";
inline constexpr std::string_view kEndOfMsgToken = "<|end_of_msg|>";
inline constexpr std::string_view kOpenToken = "<|open|>";
inline constexpr std::string_view kCloseToken = "<|close|>";
inline constexpr std::string_view kSepToken = "<|sep|>";

class Tokenizer {
 public:
  static Result<Tokenizer> load(const std::string& path, PreTokenizer pre);
  // Assembles a tokenizer from parts; fails if a control id collides with a rank or another
  // control token, or a name repeats. `source` names the origin in errors.
  static Result<Tokenizer> create(RankTable ranks, std::vector<SpecialToken> specials,
                                  PreTokenizer pre, std::string source);

  Result<std::vector<TokenId>> encode(std::string_view text, bool allow_special) const;
  // Appends to `out`; the allocation-free form for callers that encode many segments.
  Status encode_into(std::string_view text, bool allow_special, std::vector<TokenId>& out) const;

  Result<std::string> decode_bytes(std::span<const TokenId> ids) const;
  Result<std::string> decode(std::span<const TokenId> ids) const;
  // Bytes of one token (rank bytes or control-token text); error for an unknown id.
  Result<std::string_view> token_bytes(TokenId id) const;

  // Id of a control token by name, or -1.
  TokenId special_id(std::string_view name) const;
  bool is_special(TokenId id) const;
  const std::vector<SpecialToken>& specials() const { return specials_; }

  // One more than the largest id (ranks and control tokens).
  int64_t vocab_size() const { return vocab_size_; }
  const RankTable& ranks() const { return ranks_; }
  PreTokenizer pretokenizer() const { return splitter_.kind(); }
  // Where the ranks and control-token names came from (for messages).
  const std::string& source() const { return source_; }
  const std::string& control_token_source() const { return control_source_; }

 private:
  Status encode_ordinary_into(std::string_view text, std::vector<TokenId>& out) const;
  Status encode_with_specials(std::string_view text, std::vector<TokenId>& out) const;
  // Leftmost control token at or after `from`: (position, index into specials_) or npos.
  std::pair<size_t, size_t> find_special(std::string_view text, size_t from) const;

  RankTable ranks_;
  Splitter splitter_;
  std::vector<SpecialToken> specials_;  // sorted by text length, longest first
  std::array<bool, 256> special_first_byte_{};
  std::vector<int32_t> special_index_by_id_;  // [vocab_size] index into specials_ or -1
  int64_t vocab_size_ = 0;
  std::string source_;
  std::string control_source_;
};

}  // namespace attnres
