// attnres tokenize / detokenize: text <-> token ids with a tiktoken.model tokenizer.
//   tokenize   --tokenizer PATH [--pattern kimi|o200k_base|cl100k_base] (--text T | --file F)
//              [--allow-special] [--json]       ids separated by spaces, or a JSON array
//   tokenize   --tokenizer PATH --chat MESSAGES.json [--no-thinking] [--no-generation-prompt]
//              the Kimi-K3 chat encoding of an OpenAI-style message list (see chat.h)
//   detokenize --tokenizer PATH [--pattern ...] (--ids 1,2,3 | --file F) [--raw]
//              text (ill-formed UTF-8 shown as U+FFFD), or with --raw the exact token bytes
// Errors (missing or malformed rank file, unknown id, bad id list) name the file, line or id and
// exit with status 1.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace attnres::cli {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  std::string pattern = "kimi";
  std::string text;
  std::string file;
  std::string ids;
  std::string chat;
  bool has_text = false;
  bool no_thinking = false;
  bool no_generation_prompt = false;
  bool allow_special = false;
  bool json = false;
  bool raw = false;
};

Result<std::string> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(ErrorCode::kIoError, path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<Tokenizer> load_tokenizer(const TokenizeArgs& a) {
  ATTNRES_ASSIGN_OR_RETURN(PreTokenizer pre, parse_pretokenizer(a.pattern));
  return Tokenizer::load(a.tokenizer, pre);
}

// Ids separated by commas and/or whitespace, optionally inside a JSON-style [ ].
Result<std::vector<TokenId>> parse_ids(std::string_view s, const std::string& where) {
  std::vector<TokenId> ids;
  size_t i = 0;
  auto is_sep = [](char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (i < s.size() && (is_sep(s[i]) || s[i] == '[')) ++i;
  size_t end = s.size();
  while (end > i && (is_sep(s[end - 1]) || s[end - 1] == ']')) --end;
  while (i < end) {
    size_t j = i;
    while (j < end && !is_sep(s[j])) ++j;
    const std::string_view tok = s.substr(i, j - i);
    int64_t v = 0;
    bool ok = !tok.empty() && tok.size() <= 10;
    for (char c : tok) {
      ok = ok && c >= '0' && c <= '9';
      if (ok) v = v * 10 + (c - '0');
    }
    if (!ok || v > INT32_MAX)
      return Status(ErrorCode::kInvalidArgument,
                    where + ": \"" + std::string(tok.substr(0, 40)) +
                        "\" is not a token id (expected non-negative integers separated by commas "
                        "or spaces)");
    ids.push_back(static_cast<TokenId>(v));
    i = j;
    while (i < end && is_sep(s[i])) ++i;
  }
  return ids;
}

// The chat encoding of a JSON file holding a message list (or {"messages": [...]}).
Result<std::vector<TokenId>> encode_chat_file(const Tokenizer& tok, const TokenizeArgs& a) {
  ATTNRES_ASSIGN_OR_RETURN(std::string text, read_all(a.chat));
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status(ErrorCode::kBadJson, a.chat + ": not valid JSON");
  if (j.is_object() && j.contains("messages")) j = j["messages"];
  auto messages = chat_messages_from_json(j);
  if (!messages)
    return Status(messages.status().code(), a.chat + ": " + messages.status().message());
  ChatOptions options;
  options.thinking = !a.no_thinking;
  options.add_generation_prompt = !a.no_generation_prompt;
  return encode_chat(tok, *messages, options);
}

int run_tokenize(const TokenizeArgs& a) {
  if (int{a.has_text} + int{!a.file.empty()} + int{!a.chat.empty()} != 1)
    return fail("tokenize: give exactly one of --text, --file or --chat");
  std::string text = a.text;
  if (!a.file.empty()) {
    auto r = read_all(a.file);
    if (!r) return fail(r.status().message());
    text = std::move(r).value();
  }
  auto tok = load_tokenizer(a);
  if (!tok) return fail(tok.status().to_string());
  auto ids = a.chat.empty() ? tok->encode(text, a.allow_special) : encode_chat_file(*tok, a);
  if (!ids) return fail(ids.status().to_string());
  if (a.json) {
    std::cout << nlohmann::json(*ids).dump() << "\n";
  } else {
    std::string line;
    for (size_t i = 0; i < ids->size(); ++i) line += (i ? " " : "") + std::to_string((*ids)[i]);
    std::cout << line << "\n";
  }
  return 0;
}

int run_detokenize(const TokenizeArgs& a) {
  if (a.ids.empty() == a.file.empty())
    return fail("detokenize: give exactly one of --ids or --file");
  std::string list = a.ids;
  std::string where = "--ids";
  if (!a.file.empty()) {
    auto r = read_all(a.file);
    if (!r) return fail(r.status().message());
    list = std::move(r).value();
    where = a.file;
  }
  auto ids = parse_ids(list, where);
  if (!ids) return fail(ids.status().message());
  auto tok = load_tokenizer(a);
  if (!tok) return fail(tok.status().to_string());
  auto text = a.raw ? tok->decode_bytes(*ids) : tok->decode(*ids);
  if (!text) return fail(text.status().message());
  std::fwrite(text->data(), 1, text->size(), stdout);
  if (!a.raw) std::fputc('\n', stdout);
  return 0;
}

void add_common(CLI::App* sub, TokenizeArgs& a) {
  sub->add_option("--tokenizer", a.tokenizer, "tiktoken.model file, or a directory holding one")
      ->required();
  sub->add_option("--pattern", a.pattern, "Pre-tokenizer: kimi (default), o200k_base, cl100k_base");
}

const CommandRegistration kTokenize(
    "tokenize", "Encode text to token ids", [](CLI::App* sub) -> CommandRun {
      auto a = std::make_shared<TokenizeArgs>();
      add_common(sub, *a);
      sub->add_option_function<std::string>(
          "--text",
          [a](const std::string& t) {
            a->text = t;
            a->has_text = true;
          },
          "Text to encode");
      sub->add_option("--file", a->file, "File whose bytes are encoded");
      sub->add_flag("--allow-special", a->allow_special,
                    "Control-token names in the text become control tokens (default: plain text)");
      sub->add_option("--chat", a->chat,
                      "JSON message list to encode in the Kimi-K3 chat format (control tokens "
                      "only for the format's markers)");
      sub->add_flag("--no-thinking", a->no_thinking, "Chat: thinking off (no think parts)");
      sub->add_flag("--no-generation-prompt", a->no_generation_prompt,
                    "Chat: do not open the assistant's turn at the end");
      sub->add_flag("--json", a->json, "Print a JSON array");
      return [a] { return run_tokenize(*a); };
    });

const CommandRegistration kDetokenize(
    "detokenize", "Decode token ids to text", [](CLI::App* sub) -> CommandRun {
      auto a = std::make_shared<TokenizeArgs>();
      add_common(sub, *a);
      sub->add_option("--ids", a->ids, "Comma- or space-separated ids");
      sub->add_option("--file", a->file, "File of ids (commas, whitespace or a JSON array)");
      sub->add_flag("--raw", a->raw, "Write the exact token bytes (no U+FFFD replacement)");
      return [a] { return run_detokenize(*a); };
    });

}  // namespace
}  // namespace attnres::cli
