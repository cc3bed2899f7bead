// PCRE2 pre-tokenizer; see pretokenizer.h for the contract and the pattern rewrites.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include "tokenizer/unicode_delta.h"
#include "tokenizer/utf8.h"

namespace attnres {
namespace {

// Unicode White_Space (PropList.txt), the set Rust regex's `\s` matches. Class body, no brackets.
constexpr std::string_view kWhiteSpace =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// Published spellings (tiktoken / tokenization_kimi.py).
constexpr std::string_view kKimiPublished =
    R"([\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kO200kPublished =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kCl100kPublished =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// PCRE2 spellings, built once. Every Unicode property class also lists the characters that
// the reference's newer Unicode tables add to it (unicode_delta.h), so the split does not depend
// on the Unicode version of the installed PCRE2.
struct Pcre2Patterns {
  std::string kimi, o200k, cl100k;
  Pcre2Patterns() {
    namespace d = unicode_delta;
    const std::string ws(kWhiteSpace);
    const std::string letter = "\\p{L}" + std::string(d::kL);
    const std::string number = "\\p{N}" + std::string(d::kN);
    const std::string han = "\\p{sc:Han}" + std::string(d::kHan);
    const std::string upperish = "\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}" + std::string(d::kLu) +
                                 std::string(d::kLt) + std::string(d::kLm) + std::string(d::kLo) +
                                 std::string(d::kM);
    const std::string lowerish = "\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}" + std::string(d::kLl) +
                                 std::string(d::kLm) + std::string(d::kLo) + std::string(d::kM);
    const std::string contractions = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
    const std::string not_letter_number = "[^\\r\\n" + letter + number + "]?";
    const std::string numbers = "|[" + number + "]{1,3}";
    const std::string ws_tail =
        "|[" + ws + "]*[\\r\\n]+|[" + ws + "]+(?![^" + ws + "])|[" + ws + "]+";
    const std::string punct = "| ?[^" + ws + letter + number + "]+";
    // Kimi: [X&&[^\p{Han}]] becomes (?:(?!Han)[X]).
    const std::string up_not_han = "(?:(?![" + han + "])[" + upperish + "])";
    const std::string low_not_han = "(?:(?![" + han + "])[" + lowerish + "])";
    kimi = "[" + han + "]+" +  //
           "|" + not_letter_number + up_not_han + "*" + low_not_han + "+" + contractions + "?" +
           "|" + not_letter_number + up_not_han + "+" + low_not_han + "*" + contractions + "?" +
           numbers + punct + "[\\r\\n]*" + ws_tail;
    o200k = not_letter_number + "[" + upperish + "]*[" + lowerish + "]+" + contractions + "?" +
            "|" + not_letter_number + "[" + upperish + "]+[" + lowerish + "]*" + contractions +
            "?" + numbers + punct + "[\\r\\n/]*" + ws_tail;
    cl100k = contractions + "|" + not_letter_number + "[" + letter + "]+" + numbers + punct +
             "[\\r\\n]*" + ws_tail;
  }
};

const Pcre2Patterns& pcre2_patterns() {
  static const Pcre2Patterns p;
  return p;
}

// Per-thread match scratch: match data with one ovector pair (the patterns have no captures)
// and a JIT stack large enough for long letter runs through the lookahead groups.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 16 * 1024 * 1024, nullptr);
    if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

MatchScratch& match_scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

}  // namespace

struct Splitter::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

std::string_view pretokenizer_name(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::kKimi:
      return "kimi";
    case PreTokenizer::kO200kBase:
      return "o200k_base";
    case PreTokenizer::kCl100kBase:
      return "cl100k_base";
  }
  return "?";
}

Result<PreTokenizer> parse_pretokenizer(std::string_view name) {
  for (PreTokenizer p : {PreTokenizer::kKimi, PreTokenizer::kO200kBase, PreTokenizer::kCl100kBase})
    if (name == pretokenizer_name(p)) return p;
  return Status(ErrorCode::kInvalidArgument, "unknown pre-tokenizer pattern \"" +
                                                 std::string(name) +
                                                 "\" (expected kimi, o200k_base or cl100k_base)");
}

std::string_view published_pattern(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::kKimi:
      return kKimiPublished;
    case PreTokenizer::kO200kBase:
      return kO200kPublished;
    case PreTokenizer::kCl100kBase:
      return kCl100kPublished;
  }
  return {};
}

std::string_view pcre2_pattern(PreTokenizer p) {
  switch (p) {
    case PreTokenizer::kKimi:
      return pcre2_patterns().kimi;
    case PreTokenizer::kO200kBase:
      return pcre2_patterns().o200k;
    case PreTokenizer::kCl100kBase:
      return pcre2_patterns().cl100k;
  }
  return {};
}

Result<Splitter> Splitter::create(PreTokenizer p) {
  const std::string_view pattern = pcre2_pattern(p);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  auto code = std::make_shared<Code>();
  code->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
  if (code->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return Status(ErrorCode::kInternal, "pre-tokenizer " + std::string(pretokenizer_name(p)) +
                                            ": PCRE2 rejected the pattern at offset " +
                                            std::to_string(err_offset) + ": " +
                                            reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation: where it is unavailable the interpreter gives the same matches.
  (void)pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);
  Splitter s;
  s.kind_ = p;
  s.code_ = std::move(code);
  return s;
}

Status Splitter::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  MatchScratch& ms = match_scratch();
  if (ms.data == nullptr || ms.context == nullptr)
    return Status(ErrorCode::kInternal, "pre-tokenizer: out of memory for PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code_->code, subject, text.size(), pos, 0, ms.data, ms.context);
    if (rc == PCRE2_ERROR_NOMATCH) {
      pieces.push_back(text.substr(pos));  // only ill-formed bytes remain
      break;
    }
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return Status(ErrorCode::kInternal, "pre-tokenizer " + std::string(pretokenizer_name(kind_)) +
                                              ": PCRE2 match failed at byte " +
                                              std::to_string(pos) + ": " +
                                              reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.data);
    const size_t start = ov[0], end = ov[1];
    if (start > pos) pieces.push_back(text.substr(pos, start - pos));
    if (end == start) {
      // No alternative matches the empty string; guard against an endless loop regardless.
      const Utf8Step st = utf8_step(text, start);
      pieces.push_back(text.substr(start, st.length));
      pos = start + st.length;
      continue;
    }
    pieces.push_back(text.substr(start, end - start));
    pos = end;
  }
  return Status::ok();
}

std::vector<std::string_view> kimi_chunks(std::string_view text, size_t max_chunk_chars,
                                          size_t max_run_chars) {
  std::vector<std::string_view> out;
  // Code-point boundaries of the 400k-character chunks.
  size_t chunk_start = 0;
  while (true) {
    size_t end = chunk_start, chars = 0;
    while (end < text.size() && chars < max_chunk_chars) {
      end += utf8_step(text, end).length;
      ++chars;
    }
    const std::string_view chunk = text.substr(chunk_start, end - chunk_start);
    // Split runs of whitespace / non-whitespace longer than max_run_chars.
    size_t slice_start = 0, run = 0, i = 0;
    bool run_is_space = false;
    if (!chunk.empty()) {
      const Utf8Step s0 = utf8_step(chunk, 0);
      run_is_space = s0.ok && python_isspace(s0.codepoint);
    }
    while (i < chunk.size()) {
      const Utf8Step s = utf8_step(chunk, i);
      const bool is_space = s.ok && python_isspace(s.codepoint);
      if (is_space != run_is_space) {
        run = 1;
        run_is_space = is_space;
      } else if (++run > max_run_chars) {
        out.push_back(chunk.substr(slice_start, i - slice_start));
        slice_start = i;
        run = 1;
      }
      i += s.length;
    }
    out.push_back(chunk.substr(slice_start));
    chunk_start = end;
    if (chunk_start >= text.size()) break;
  }
  return out;
}

}  // namespace attnres
