// Tokenizer loading, encoding and decoding; see tokenizer.h for the contract.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"
#include "util/file.h"

namespace attnres {
namespace {

constexpr std::pair<int, std::string_view> kKimiK3Control[] = {
    {0, kBosToken},   {1, kEosToken}, {2, kEndOfMsgToken}, {3, kOpenToken},
    {4, kCloseToken}, {5, kSepToken}, {254, "[UNK]"},      {255, "[PAD]"},
};

// tiktoken's special tokens of the OpenAI encodings (tiktoken_ext/openai_public.py).
const std::vector<SpecialToken>& openai_specials(PreTokenizer p) {
  static const std::vector<SpecialToken> kO200k = {{"<|endoftext|>", 199999},
                                                   {"<|endofprompt|>", 200018}};
  static const std::vector<SpecialToken> kCl100k = {{"<|endoftext|>", 100257},
                                                    {"<|fim_prefix|>", 100258},
                                                    {"<|fim_middle|>", 100259},
                                                    {"<|fim_suffix|>", 100260},
                                                    {"<|endofprompt|>", 100276}};
  return p == PreTokenizer::kO200kBase ? kO200k : kCl100k;
}

// Kimi's control-token table: names for [base, base + 256) from tokenizer_config.json's
// added_tokens_decoder (ids outside the range are ignored, as tokenization_kimi.py does), the
// built-in K3 names otherwise; unnamed slots get the reserved spelling.
Result<std::vector<SpecialToken>> kimi_specials(TokenId base, const std::string& config_path,
                                                std::string& control_source) {
  std::vector<std::string> names(kKimiReservedTokens);
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    ATTNRES_ASSIGN_OR_RETURN(std::string text, read_model_file(config_path, "tokenizer config"));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return Status(ErrorCode::kBadJson, config_path + ": not valid JSON");
    if (!j.is_object() || !j.contains("added_tokens_decoder"))
      return Status(ErrorCode::kMissingField, config_path + ": missing \"added_tokens_decoder\"");
    const nlohmann::json& added = j["added_tokens_decoder"];
    if (!added.is_object())
      return Status(ErrorCode::kWrongType,
                    config_path + ": \"added_tokens_decoder\" must be an object of id -> token");
    for (const auto& [key, entry] : added.items()) {
      int64_t id = -1;
      bool numeric = !key.empty() && key.size() <= 10;
      for (char c : key) numeric = numeric && c >= '0' && c <= '9';
      if (numeric) id = std::stoll(key);
      if (!numeric)
        return Status(ErrorCode::kInvalidValue,
                      config_path + ": added_tokens_decoder key \"" + key + "\" is not a token id");
      if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string())
        return Status(ErrorCode::kWrongType, config_path + ": added_tokens_decoder[\"" + key +
                                                 "\"].content must be a string");
      if (id < base || id >= base + kKimiReservedTokens) continue;
      names[static_cast<size_t>(id - base)] = entry["content"].get<std::string>();
    }
    control_source = config_path;
  } else {
    for (const auto& [offset, name] : kKimiK3Control) names[offset] = std::string(name);
    control_source = "built-in Kimi-K3 control-token table";
  }
  std::vector<SpecialToken> out;
  out.reserve(kKimiReservedTokens);
  for (int i = 0; i < kKimiReservedTokens; ++i) {
    const TokenId id = base + i;
    out.push_back(
        {names[i].empty() ? "<|reserved_token_" + std::to_string(id) + "|>" : names[i], id});
  }
  return out;
}

}  // namespace

std::span<const std::pair<int, std::string_view>> kimi_k3_control_tokens() {
  return kKimiK3Control;
}

Result<Tokenizer> Tokenizer::create(RankTable ranks, std::vector<SpecialToken> specials,
                                    PreTokenizer pre, std::string source) {
  ATTNRES_ASSIGN_OR_RETURN(Splitter splitter, Splitter::create(pre));
  Tokenizer t;
  t.splitter_ = std::move(splitter);
  t.source_ = std::move(source);
  int64_t vocab = static_cast<int64_t>(ranks.max_rank()) + 1;
  for (const SpecialToken& s : specials) {
    if (s.id < 0)
      return Status(ErrorCode::kInvalidValue,
                    t.source_ + ": control token \"" + s.text + "\" has a negative id");
    if (s.text.empty())
      return Status(ErrorCode::kInvalidValue,
                    t.source_ + ": control token " + std::to_string(s.id) + " has an empty name");
    if (ranks.is_token(s.id))
      return Status(ErrorCode::kInconsistent, t.source_ + ": control token \"" + s.text + "\" id " +
                                                  std::to_string(s.id) + " is also a BPE rank");
    vocab = std::max<int64_t>(vocab, int64_t{s.id} + 1);
  }
  t.ranks_ = std::move(ranks);
  t.vocab_size_ = vocab;
  std::stable_sort(
      specials.begin(), specials.end(),
      [](const SpecialToken& a, const SpecialToken& b) { return a.text.size() > b.text.size(); });
  t.special_index_by_id_.assign(static_cast<size_t>(vocab), -1);
  for (size_t i = 0; i < specials.size(); ++i) {
    const SpecialToken& s = specials[i];
    if (t.special_index_by_id_[s.id] >= 0)
      return Status(ErrorCode::kInconsistent,
                    t.source_ + ": control token id " + std::to_string(s.id) + " is named twice");
    for (size_t k = 0; k < i; ++k)
      if (specials[k].text == s.text)
        return Status(ErrorCode::kInconsistent,
                      t.source_ + ": control token name \"" + s.text + "\" is used by ids " +
                          std::to_string(specials[k].id) + " and " + std::to_string(s.id));
    t.special_index_by_id_[s.id] = static_cast<int32_t>(i);
    t.special_first_byte_[static_cast<unsigned char>(s.text[0])] = true;
  }
  t.specials_ = std::move(specials);
  return t;
}

Result<Tokenizer> Tokenizer::load(const std::string& path, PreTokenizer pre) {
  namespace fs = std::filesystem;
  std::string model_path = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) model_path = (fs::path(path) / "tiktoken.model").string();
  if (!fs::exists(model_path, ec))
    return Status(ErrorCode::kIoError, model_path + ": tokenizer rank file not found");
  ATTNRES_ASSIGN_OR_RETURN(RankTable ranks, RankTable::load(model_path));
  std::vector<SpecialToken> specials;
  std::string control_source;
  if (pre == PreTokenizer::kKimi) {
    const std::string config =
        (fs::path(model_path).parent_path() / "tokenizer_config.json").string();
    ATTNRES_ASSIGN_OR_RETURN(
        specials, kimi_specials(static_cast<TokenId>(ranks.size()), config, control_source));
  } else {
    specials = openai_specials(pre);
    control_source = "tiktoken's " + std::string(pretokenizer_name(pre)) + " special tokens";
  }
  ATTNRES_ASSIGN_OR_RETURN(Tokenizer t,
                           create(std::move(ranks), std::move(specials), pre, model_path));
  t.control_source_ = std::move(control_source);
  return t;
}

std::pair<size_t, size_t> Tokenizer::find_special(std::string_view text, size_t from) const {
  for (size_t pos = from; pos < text.size(); ++pos) {
    if (!special_first_byte_[static_cast<unsigned char>(text[pos])]) continue;
    for (size_t i = 0; i < specials_.size(); ++i) {  // longest first
      const std::string& s = specials_[i].text;
      if (text.compare(pos, s.size(), s) == 0) return {pos, i};
    }
  }
  return {std::string_view::npos, 0};
}

Status Tokenizer::encode_ordinary_into(std::string_view text, std::vector<TokenId>& out) const {
  thread_local std::vector<std::string_view> pieces;
  thread_local BpeScratch scratch;
  pieces.clear();
  ATTNRES_RETURN_IF_ERROR(splitter_.split(text, pieces));
  for (std::string_view piece : pieces) byte_pair_encode(ranks_, piece, scratch, out);
  return Status::ok();
}

Status Tokenizer::encode_with_specials(std::string_view text, std::vector<TokenId>& out) const {
  size_t start = 0;
  while (true) {
    const auto [pos, index] = find_special(text, start);
    if (pos == std::string_view::npos) return encode_ordinary_into(text.substr(start), out);
    ATTNRES_RETURN_IF_ERROR(encode_ordinary_into(text.substr(start, pos - start), out));
    out.push_back(specials_[index].id);
    start = pos + specials_[index].text.size();
  }
}

Status Tokenizer::encode_into(std::string_view text, bool allow_special,
                              std::vector<TokenId>& out) const {
  const bool specials = allow_special && !specials_.empty();
  // Kimi's encode() cuts the text before tiktoken sees it and encodes each part on its own. The
  // cuts only exist for texts with a 25,000-character run or over 400,000 characters, both of
  // which need more than 25,000 bytes.
  if (splitter_.kind() == PreTokenizer::kKimi && text.size() > 25000) {
    for (std::string_view part : kimi_chunks(text)) {
      ATTNRES_RETURN_IF_ERROR(specials ? encode_with_specials(part, out)
                                       : encode_ordinary_into(part, out));
    }
    return Status::ok();
  }
  return specials ? encode_with_specials(text, out) : encode_ordinary_into(text, out);
}

Result<std::vector<TokenId>> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 1);
  ATTNRES_RETURN_IF_ERROR(encode_into(text, allow_special, out));
  return out;
}

Result<std::string_view> Tokenizer::token_bytes(TokenId id) const {
  if (ranks_.is_token(id)) return ranks_.bytes(id);
  if (id >= 0 && id < vocab_size_ && special_index_by_id_[id] >= 0)
    return std::string_view(specials_[special_index_by_id_[id]].text);
  return Status(ErrorCode::kInvalidValue,
                "unknown token id " + std::to_string(id) + " (tokenizer " + source_ +
                    " has ids 0.." + std::to_string(vocab_size_ - 1) +
                    (id >= 0 && id < vocab_size_ ? ", and this one is unassigned)" : ")"));
}

Result<std::string> Tokenizer::decode_bytes(std::span<const TokenId> ids) const {
  std::string out;
  for (TokenId id : ids) {
    ATTNRES_ASSIGN_OR_RETURN(std::string_view b, token_bytes(id));
    out.append(b);
  }
  return out;
}

Result<std::string> Tokenizer::decode(std::span<const TokenId> ids) const {
  ATTNRES_ASSIGN_OR_RETURN(std::string bytes, decode_bytes(ids));
  return utf8_lossy(bytes);
}

TokenId Tokenizer::special_id(std::string_view name) const {
  for (const SpecialToken& s : specials_)
    if (s.text == name) return s.id;
  return -1;
}

bool Tokenizer::is_special(TokenId id) const {
  return id >= 0 && id < vocab_size_ && special_index_by_id_[id] >= 0;
}

}  // namespace attnres
