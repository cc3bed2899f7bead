// libFuzzer target for the tokenizer's untrusted inputs. The first byte picks the mode:
//   0: RankTable::parse on the rest (a tiktoken.model); on success every rank's bytes must look
//      up to that rank.
//   1-3: encode the rest with a small byte-level tokenizer under the kimi / o200k_base /
//      cl100k_base pattern, control tokens allowed or not; decode_bytes must give the input back,
//      the pieces must cover it, and streaming UTF-8 decoding must equal one-shot decoding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "tokenizer/stop.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

using namespace attnres;

const Tokenizer& tokenizer(PreTokenizer pre) {
  static const auto make = [](PreTokenizer p) {
    std::string ranks;
    for (int b = 0; b < 256; ++b)
      ranks += base64_encode(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
    int rank = 256;
    for (const char* m : {"ab", "abc", " a", "  ", "\xe4\xbd", "\xe4\xbd\xa0", "message"})
      ranks += base64_encode(m) + " " + std::to_string(rank++) + "\n";
    auto table = RankTable::parse(ranks, "fuzz-ranks");
    if (!table.is_ok()) std::abort();
    auto t = Tokenizer::create(std::move(table).value(),
                               {{"<|open|>", 300}, {"<|sep|>", 301}, {"<|end_of_msg|>", 302}}, p,
                               "fuzz");
    if (!t.is_ok()) std::abort();
    return std::move(t).value();
  };
  static const Tokenizer kimi = make(PreTokenizer::kKimi);
  static const Tokenizer o200k = make(PreTokenizer::kO200kBase);
  static const Tokenizer cl100k = make(PreTokenizer::kCl100kBase);
  return pre == PreTokenizer::kKimi ? kimi : pre == PreTokenizer::kO200kBase ? o200k : cl100k;
}

void check_rank_file(std::string_view text) {
  auto t = RankTable::parse(text, "fuzz-input", /*require_all_bytes=*/false);
  if (!t.is_ok()) {
    if (t.status().message().empty()) std::abort();
    return;
  }
  for (TokenId r = 0; r <= t->max_rank(); ++r)
    if (t->is_token(r) && t->find(t->bytes(r)) != r) std::abort();
}

void check_encode(PreTokenizer pre, bool special, std::string_view text) {
  const Tokenizer& t = tokenizer(pre);
  auto ids = t.encode(text, special);
  if (!ids.is_ok()) std::abort();
  auto back = t.decode_bytes(*ids);
  if (!back.is_ok() || *back != text) std::abort();
  Utf8StreamDecoder dec;
  std::string streamed;
  for (TokenId id : *ids) streamed += dec.push(*t.token_bytes(id));
  streamed += dec.flush();
  if (streamed != utf8_lossy(text) || !utf8_valid(streamed)) std::abort();
  StopStringMatcher stop({"<|sep|>", "ab"});
  std::string shown;
  for (char c : text) shown += stop.push(std::string_view(&c, 1));
  shown += stop.flush();
  if (shown.find("ab") != std::string::npos || text.substr(0, shown.size()) != shown) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      check_rank_file(rest);
      break;
    case 1:
      check_encode(PreTokenizer::kKimi, data[0] & 4, rest);
      break;
    case 2:
      check_encode(PreTokenizer::kO200kBase, data[0] & 4, rest);
      break;
    default:
      check_encode(PreTokenizer::kCl100kBase, data[0] & 4, rest);
      break;
  }
  return 0;
}
