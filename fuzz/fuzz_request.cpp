// libFuzzer target for the request parser of `attnres serve` (src/server/api.h): the bytes are a
// request body. Each route's parser either returns its fields or a 4xx error with a message;
// a chat body that passes is parsed by the chat template's reader, rendered, and encoded with
// a byte-level tokenizer holding the Kimi control tokens, whose ids must decode back to the
// rendered text. Errors must serialise to JSON (invalid UTF-8 replaced, never thrown on).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/api.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace attnres;
using namespace attnres::server;

const Tokenizer& tokenizer() {
  static const Tokenizer t = [] {
    std::string ranks;
    for (int b = 0; b < 256; ++b)
      ranks += base64_encode(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
    auto table = RankTable::parse(ranks, "fuzz-ranks");
    if (!table.is_ok()) std::abort();
    std::vector<SpecialToken> specials = {{"[BOS]", 256},          {"[EOS]", 257},
                                          {"<|end_of_msg|>", 258}, {"<|open|>", 259},
                                          {"<|close|>", 260},      {"<|sep|>", 261}};
    auto tok = Tokenizer::create(std::move(table).value(), specials, PreTokenizer::kKimi, "fuzz");
    if (!tok.is_ok()) std::abort();
    return std::move(tok).value();
  }();
  return t;
}

void check_error(const ApiError& e) {
  if (e.status < 400 || e.status > 499 || e.message.empty()) std::abort();
  (void)error_json(e).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

template <typename T>
void check(const Parsed<T>& p) {
  if (!p.ok()) check_error(p.error);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  auto json = parse_json_body("application/json; charset=utf-8", body);
  if (!json.ok()) {
    check_error(json.error);
    return 0;
  }
  ApiLimits limits;
  limits.vocab_size = 262;
  limits.context_length = 4096;
  limits.allow_forced_output = true;
  check(parse_completion(*json.value, limits));
  check(parse_tokenize(*json.value));
  check(parse_detokenize(*json.value, limits));
  auto chat = parse_chat_completion(*json.value, limits);
  check(chat);
  if (!chat.ok()) return 0;
  auto req = parse_chat_request(chat.value->body);
  if (!req.is_ok()) return 0;
  auto segments = render_chat_request(*req);
  if (!segments.is_ok()) return 0;
  const std::string text = chat_segments_text(*segments);
  auto ids = encode_chat_segments(tokenizer(), *segments);
  if (!ids.is_ok()) std::abort();  // every control marker is in this tokenizer
  auto back = tokenizer().decode_bytes(*ids);
  if (!back.is_ok() || *back != text) std::abort();
  return 0;
}
