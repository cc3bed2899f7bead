// ChatOutputParser: the failure classes of serving.md §3, each checked with every split of the
// output into chunks (every cut point, every pair of cut points, byte by byte, random splits,
// all merged into one push), streaming against one-shot; and round trips: assistant messages
// rendered by the template renderer (itself checked against jinja2 in test_chat_template.cpp),
// as segments and as token ids, parse back to what was rendered.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "tokenizer/chat_parse.h"

namespace attnres {
namespace {

using Json = nlohmann::ordered_json;

// Model output built from markers and text.
struct Out {
  std::vector<ChatPiece> pieces;
  Out& ctl(std::string_view s) {
    pieces.push_back({std::string(s), true});
    return *this;
  }
  Out& t(std::string s) {
    pieces.push_back({std::move(s), false});
    return *this;
  }
  Out& o(std::string tag) { return ctl(kOpenToken).t(std::move(tag)).ctl(kSepToken); }
  Out& c(std::string tag) { return ctl(kCloseToken).t(std::move(tag)).ctl(kSepToken); }
  Out& arg(std::string key, std::string type, std::string value) {
    return o("argument key=\"" + key + "\" type=\"" + type + "\"")
        .t(std::move(value))
        .c("argument");
  }
  Out& eom() { return ctl(kEndOfMsgToken); }
};

struct Expect {
  std::optional<std::string> reasoning;
  std::optional<std::string> content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
};

// What a client accumulates from the streamed events.
struct Streamed {
  std::string reasoning;
  std::string content;
  std::vector<ChatParsedToolCall> calls;
  bool ok = true;
  std::string why;
};

void accumulate(const std::vector<ChatEvent>& events, Streamed& s) {
  for (const ChatEvent& e : events) {
    if (e.kind == ChatEventKind::kToolCall) {
      if (e.call.index != s.calls.size()) {
        s.ok = false;
        s.why = "tool call index " + std::to_string(e.call.index) + " out of order";
      }
      s.calls.push_back(e.call);
      continue;
    }
    if (e.text.empty() || !utf8_valid(e.text)) {
      s.ok = false;
      s.why = "empty or ill-formed text event";
    }
    (e.kind == ChatEventKind::kReasoning ? s.reasoning : s.content) += e.text;
  }
}

// Adjacent text pieces merged: the canonical form that cuts are applied to.
std::vector<ChatPiece> merged_text(const std::vector<ChatPiece>& in) {
  std::vector<ChatPiece> out;
  for (const ChatPiece& p : in) {
    if (!p.control && !out.empty() && !out.back().control) {
      out.back().text += p.text;
    } else {
      out.push_back(p);
    }
  }
  return out;
}

// Positions: a control piece is one position, a text piece one per byte. `cuts` (sorted) are
// chunk boundaries before those positions; a cut inside a text piece splits it.
std::vector<std::vector<ChatPiece>> chunks_at(const std::vector<ChatPiece>& pieces,
                                              const std::vector<size_t>& cuts) {
  std::vector<std::vector<ChatPiece>> chunks(1);
  size_t pos = 0;
  size_t next = 0;
  auto cut_here = [&] {
    while (next < cuts.size() && cuts[next] == pos) {
      if (!chunks.back().empty()) chunks.emplace_back();
      ++next;
    }
  };
  for (const ChatPiece& p : pieces) {
    if (p.control) {
      cut_here();
      chunks.back().push_back(p);
      ++pos;
      continue;
    }
    size_t begin = 0;
    for (size_t i = 0; i < p.text.size(); ++i, ++pos) {
      if (next < cuts.size() && cuts[next] == pos && i > begin) {
        chunks.back().push_back({p.text.substr(begin, i - begin), false});
        begin = i;
      }
      cut_here();
    }
    chunks.back().push_back({p.text.substr(begin), false});
  }
  return chunks;
}

size_t positions(const std::vector<ChatPiece>& pieces) {
  size_t n = 0;
  for (const ChatPiece& p : pieces) n += p.control ? 1 : p.text.size();
  return n;
}

Streamed stream(const std::vector<std::vector<ChatPiece>>& chunks, const ChatParserOptions& opt,
                ChatOutputEnd end) {
  ChatOutputParser parser(opt);
  Streamed s;
  for (const auto& chunk : chunks) accumulate(parser.push(chunk), s);
  accumulate(parser.finish(end), s);
  const ChatParsed r = parser.result();
  if (r.reasoning_content.value_or("") != s.reasoning || r.content.value_or("") != s.content ||
      r.tool_calls.size() != s.calls.size()) {
    s.ok = false;
    s.why = "result() differs from the streamed events";
  }
  return s;
}

bool same(const Streamed& s, const ChatParsed& ref) {
  if (s.reasoning != ref.reasoning_content.value_or("") || s.content != ref.content.value_or("") ||
      s.calls.size() != ref.tool_calls.size())
    return false;
  for (size_t i = 0; i < s.calls.size(); ++i) {
    const auto& a = s.calls[i];
    const auto& b = ref.tool_calls[i];
    if (a.index != b.index || a.id != b.id || a.name != b.name || a.arguments != b.arguments)
      return false;
  }
  return true;
}

std::string describe(const std::vector<std::vector<ChatPiece>>& chunks) {
  std::string s;
  for (const auto& chunk : chunks) {
    s += "[";
    for (const ChatPiece& p : chunk) s += p.control ? p.text : "'" + p.text + "'";
    s += "] ";
  }
  return s;
}

// Every split of `out` gives the one-shot result. Returns the number of splits checked.
size_t check_splits(const std::vector<ChatPiece>& pieces_in, const ChatParserOptions& opt,
                    ChatOutputEnd end, const ChatParsed& ref) {
  const std::vector<ChatPiece> pieces = merged_text(pieces_in);
  const size_t n = positions(pieces);
  size_t checked = 0;
  auto check = [&](const std::vector<size_t>& cuts) {
    const auto chunks = chunks_at(pieces, cuts);
    const Streamed s = stream(chunks, opt, end);
    ++checked;
    if (!s.ok || !same(s, ref)) {
      ADD_FAILURE() << (s.ok ? "streamed result differs from one-shot" : s.why)
                    << "\n chunks: " << describe(chunks) << "\n streamed reasoning '" << s.reasoning
                    << "' content '" << s.content << "' calls " << s.calls.size()
                    << "\n one-shot reasoning '" << ref.reasoning_content.value_or("<null>")
                    << "' content '" << ref.content.value_or("<null>") << "' calls "
                    << ref.tool_calls.size();
      return false;
    }
    return true;
  };
  if (!check({})) return checked;  // everything merged into one push
  for (size_t k = 1; k < n; ++k)
    if (!check({k})) return checked;
  std::vector<size_t> all;
  for (size_t k = 1; k < n; ++k) all.push_back(k);
  if (!check(all)) return checked;  // byte by byte
  std::mt19937_64 rng(n);
  const bool every_pair = n <= 160;
  for (size_t a = 1; a < n && every_pair; ++a)
    for (size_t b = a + 1; b < n; ++b)
      if (!check({a, b})) return checked;
  for (int r = 0; r < 300; ++r) {
    std::vector<size_t> cuts;
    for (size_t k = 1; k < n; ++k)
      if (rng() % 4 == 0) cuts.push_back(k);
    if (!check(cuts)) return checked;
  }
  return checked;
}

ChatParsed check_case(const Out& out, bool thinking, ChatOutputEnd end, const Expect& want,
                      size_t* splits = nullptr) {
  ChatParserOptions opt;
  opt.thinking = thinking;
  const ChatParsed ref = parse_chat_output(out.pieces, opt, end);
  EXPECT_EQ(ref.reasoning_content, want.reasoning);
  EXPECT_EQ(ref.content, want.content);
  EXPECT_EQ(ref.tool_calls.size(), want.calls.size());
  for (size_t i = 0; i < std::min(ref.tool_calls.size(), want.calls.size()); ++i) {
    EXPECT_EQ(ref.tool_calls[i].index, i);
    EXPECT_EQ(ref.tool_calls[i].id, "call_" + std::to_string(i));
    EXPECT_EQ(ref.tool_calls[i].name, want.calls[i].first);
    EXPECT_EQ(ref.tool_calls[i].arguments, want.calls[i].second);
  }
  const size_t n = check_splits(out.pieces, opt, end, ref);
  if (splits) *splits += n;
  return ref;
}

const ChatOutputEnd kEnd = ChatOutputEnd::kEndOfMessage;
const ChatOutputEnd kCut = ChatOutputEnd::kTruncated;

// 1. max_tokens inside the think channel: no think markers at all in the output (the opener
// was in the prompt): content null, reasoning set, finish_reason length.
TEST(ChatOutputParser, TruncatedInsideThinking) {
  size_t splits = 0;
  const ChatParsed r = check_case(Out().t("Let me add 2 and 2. ").t("It is 4, so"), true, kCut,
                                  {"Let me add 2 and 2. It is 4, so", std::nullopt, {}}, &splits);
  EXPECT_EQ(chat_finish_reason(r, true), "length");
  // Cut inside the closing tag: the partial tag is dropped, nothing else changes.
  check_case(Out().t("thinking").ctl(kCloseToken).t("thi"), true, kCut,
             {"thinking", std::nullopt, {}}, &splits);
  // Cut inside a multi-byte character: the incomplete tail becomes U+FFFD.
  check_case(Out().t("\xe6\x80\x9d\xe6\x80"), true, kCut,
             {"\xe6\x80\x9d\xef\xbf\xbd", std::nullopt, {}}, &splits);
  EXPECT_GT(splits, 100u);
}

// 2. The model skips thinking: with thinking off plain text is content; with thinking on,
// `response` without closing `think`, or text after `C think S` without `response`.
TEST(ChatOutputParser, AnswersWithoutThinking) {
  check_case(Out().t("The answer is 4.").c("response").c("message").eom(), false, kEnd,
             {std::nullopt, "The answer is 4.", {}});
  check_case(Out().t("The answer").eom(), false, kEnd, {std::nullopt, "The answer", {}});
  check_case(Out().o("response").t("4").c("response").c("message").eom(), true, kEnd,
             {std::nullopt, "4", {}});
  check_case(Out().t("quick").o("response").t("4").c("message").eom(), true, kEnd,
             {"quick", "4", {}});
  check_case(Out().c("think").t("plain 4").eom(), true, kEnd, {std::nullopt, "plain 4", {}});
  // Whitespace between channels is not content.
  check_case(Out().t("r").c("think").t("\n ").o("response").t("4").c("response").t("\n").eom(),
             true, kEnd, {"r", "4", {}});
  const ChatParsed r = check_case(Out().t("r").c("think").o("response").t("ok").c("response").eom(),
                                  true, kEnd, {"r", "ok", {}});
  EXPECT_EQ(chat_finish_reason(r, false), "stop");
}

// 3. `tools` straight from `think`, or the message closed without closing `response`: calls
// kept, no terminator in content.
TEST(ChatOutputParser, LeavesChannelsWithoutClosingThem) {
  const std::string weather = R"({"city": "Paris"})";
  const ChatParsed r =
      check_case(Out()
                     .t("need weather")
                     .o("tools")
                     .o("call tool=\"get_weather\" index=\"1\"")
                     .arg("city", "string", "Paris")
                     .c("call")
                     .c("tools")
                     .c("message")
                     .eom(),
                 true, kEnd, {"need weather", std::nullopt, {{"get_weather", weather}}});
  EXPECT_EQ(chat_finish_reason(r, false), "tool_calls");
  check_case(Out().t("r").c("think").o("response").t("Sure").c("message").eom(), true, kEnd,
             {"r", "Sure", {}});
  // Calls closed implicitly by the end of the message, by the next call, or by the stop token.
  check_case(Out()
                 .o("response")
                 .t("Checking.")
                 .o("tools")
                 .o("call tool=\"a\" index=\"1\"")
                 .arg("x", "number", "1")
                 .o("call tool=\"b\" index=\"2\"")
                 .arg("y", "string", "2")
                 .c("message")
                 .eom(),
             false, kEnd,
             {std::nullopt, "Checking.", {{"a", R"({"x": 1})"}, {"b", R"({"y": "2"})"}}});
  check_case(Out().o("tools").o("call tool=\"a\"").o("argument key=\"x\" type=\"string\"").t("v"),
             true, kEnd, {std::nullopt, std::nullopt, {{"a", R"({"x": "v"})"}}});
  // A call cut off by max_tokens is dropped; the calls before it are kept.
  const ChatParsed cut = check_case(Out()
                                        .o("tools")
                                        .o("call tool=\"a\"")
                                        .c("call")
                                        .o("call tool=\"b\"")
                                        .o("argument key=\"x\" type=\"string\"")
                                        .t("partial"),
                                    true, kCut, {std::nullopt, std::nullopt, {{"a", "{}"}}});
  EXPECT_EQ(chat_finish_reason(cut, true), "tool_calls");
  // Nothing after the end of the message is read.
  check_case(Out().o("response").t("a").c("message").t("junk").o("response").t("b").eom(), true,
             kEnd, {std::nullopt, "a", {}});
}

// 4. Markers split and merged (every test here runs every split); the last think pair decides;
// text that spells markers is text.
TEST(ChatOutputParser, LastThinkPairDecidesAndSpelledMarkersAreText) {
  check_case(Out().t("a").c("think").o("think").t("b"), true, kCut, {"ab", std::nullopt, {}});
  check_case(Out().t("a").c("think").o("think").t("b").c("think").o("response").t("c").eom(), true,
             kEnd, {"ab", "c", {}});
  check_case(Out().o("response").t("x").c("response").o("think").t("y").c("think").eom(), true,
             kEnd, {"y", "x", {}});
  const std::string spelled = "<|close|>think<|sep|><|open|>response<|sep|>";
  check_case(Out().t("see " + spelled).c("think").o("response").t(spelled + "<|end_of_msg|>").eom(),
             true, kEnd, {"see " + spelled, spelled + "<|end_of_msg|>", {}});
  // Unknown tags, stray closes and separators, a tag cut short, other control tokens: dropped.
  check_case(Out()
                 .t("r")
                 .o("image")
                 .c("argument")
                 .ctl(kSepToken)
                 .ctl(kOpenToken)
                 .t("resp")
                 .c("think")
                 .ctl("[EOS]")
                 .o("response")
                 .t("ok")
                 .eom(),
             true, kEnd, {"r", "ok", {}});
}

// 5. Arguments: values keep `<`, `&`, `"` and spelled markers exactly, keys are unescaped,
// typed values are JSON, a json block is taken verbatim; no markup inside any of them.
TEST(ChatOutputParser, ArgumentsSurviveExactly) {
  const std::string tricky = "a < b && c > \"d\" <|close|>argument<|sep|> 'e'";
  Json want = Json::object();
  want["q&\"k"] = tricky;
  want["n"] = 2.5;
  want["ok"] = true;
  want["none"] = nullptr;
  want["obj"] = Json::parse(R"({"a": [1, "<&>"]})");
  want["list"] = Json::parse(R"([1, 2.0, "x"])");
  want["bad"] = "not json";
  check_case(Out()
                 .c("think")
                 .o("tools")
                 .o("call tool=\"s&amp;p&quot;\" index=\"1\"")
                 .arg("q&amp;&quot;k", "string", tricky)
                 .arg("n", "number", "2.5")
                 .arg("ok", "boolean", "true")
                 .arg("none", "null", "null")
                 .arg("obj", "object", R"({"a": [1, "<&>"]})")
                 .arg("list", "array", R"([1, 2.0, "x"])")
                 .arg("bad", "number", "not json")
                 .c("call")
                 .o("call tool=\"j\" index=\"2\"")
                 .o("json type=\"object\"")
                 .t(R"({"raw": "<&\">"})")
                 .c("json")
                 .c("call")
                 .c("tools")
                 .c("message")
                 .eom(),
             true, kEnd,
             {std::nullopt,
              std::nullopt,
              {{"s&p\"", python_json_dumps(want)}, {"j", R"({"raw": "<&\">"})"}}});
  // A call tag without a tool attribute is not a call.
  check_case(
      Out().o("tools").o("call index=\"1\"").arg("k", "string", "v").c("call").c("tools").eom(),
      true, kEnd, {std::nullopt, std::nullopt, {}});
}

// Random assistant messages rendered by the template renderer parse back to themselves, from the
// segments and from the synthetic tokenizer's token ids (pieces of one token each).
TEST(ChatOutputParser, RoundTripsRenderedAssistantMessages) {
  auto tok = Tokenizer::load(std::string(ATTNRES_FIXTURES_DIR) + "/tokenizer/synthetic",
                             PreTokenizer::kKimi);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const std::vector<std::string> atoms = {
      "hi",    " there",   "4",         "\n", "  ",    "中文",     "🚀",       "<",
      ">",     "&",        "\"",        "'",  "&amp;", "<|open|>", "<|sep|>", "<|end_of_msg|>",
      "think", "response", "e\xcc\x81", "{",  "}",     "\\"};
  std::mt19937_64 rng(7);
  auto text = [&](int max) {
    std::string s;
    for (int n = static_cast<int>(rng() % (max + 1)); n > 0; --n) s += atoms[rng() % atoms.size()];
    return s;
  };
  auto value = [&]() -> Json {
    switch (rng() % 7) {
      case 0:
        return nullptr;
      case 1:
        return rng() % 2 == 0;
      case 2:
        return static_cast<int64_t>(rng() % 2000) - 1000;
      case 3:
        return std::ldexp(static_cast<double>(rng() % 100000), static_cast<int>(rng() % 40) - 20);
      case 4:
        return Json::parse(R"({"a": [1, {"b": "<&>"}], "c": null})");
      case 5:
        return Json::array({text(3), 1.5, false});
      default:
        return text(6);
    }
  };
  const std::vector<std::string> keys = {"city", "q", "k&\"x", "日本", "n"};
  int cases = 0;
  size_t token_splits = 0;
  for (int iter = 0; iter < 150; ++iter) {
    const bool thinking = rng() % 3 != 0;
    ChatMessage m = chat_message(ChatRole::kAssistant, text(8));
    m.reasoning = text(8);
    const int ncalls = static_cast<int>(rng() % 3);
    for (int c = 0; c < ncalls; ++c) {
      ChatToolCall call;
      call.name = rng() % 2 ? "get_weather" : "a&\"b";
      for (int a = static_cast<int>(rng() % 4); a > 0; --a)
        call.arguments[keys[rng() % keys.size()]] = value();
      m.tool_calls.push_back(std::move(call));
    }
    ChatTemplateOptions o;
    o.thinking = thinking;
    o.thinking_effort.reset();
    o.add_generation_prompt = false;
    auto segments = render_chat_template(std::span(&m, 1), o);
    ASSERT_TRUE(segments.is_ok()) << segments.status().to_string();
    // The generation prompt is O message role="assistant" S O think|response S: 6 segments.
    ASSERT_GE(segments->size(), 6u);
    const std::vector<ChatPiece> output(segments->begin() + 6, segments->end());
    ChatParserOptions popt;
    popt.thinking = thinking;
    const ChatParsed got = parse_chat_output(output, popt, kEnd);
    const std::string what = chat_segments_text(*segments);
    if (thinking && !python_is_blank(m.reasoning)) {
      EXPECT_EQ(got.reasoning_content, m.reasoning) << what;
    } else {
      EXPECT_EQ(got.reasoning_content, std::nullopt) << what;
    }
    EXPECT_EQ(got.content.value_or(""), m.content) << what;
    ASSERT_EQ(got.tool_calls.size(), m.tool_calls.size()) << what;
    for (size_t c = 0; c < m.tool_calls.size(); ++c) {
      EXPECT_EQ(got.tool_calls[c].name, m.tool_calls[c].name) << what;
      EXPECT_EQ(Json::parse(got.tool_calls[c].arguments), m.tool_calls[c].arguments) << what;
    }
    // Through token ids, one piece per token, every split.
    auto ids = encode_chat_segments(*tok, output);
    ASSERT_TRUE(ids.is_ok());
    std::vector<ChatPiece> token_pieces;
    for (TokenId id : *ids) token_pieces.push_back(*chat_piece(*tok, id));
    const ChatParsed from_ids = parse_chat_output(token_pieces, popt, kEnd);
    EXPECT_EQ(from_ids.reasoning_content, got.reasoning_content) << what;
    EXPECT_EQ(from_ids.content, got.content) << what;
    EXPECT_EQ(from_ids.tool_calls.size(), got.tool_calls.size()) << what;
    if (iter < 12) token_splits += check_splits(token_pieces, popt, kEnd, from_ids);
    ++cases;
  }
  EXPECT_EQ(cases, 150);
  EXPECT_GT(token_splits, 1000u);
}

// Random marker soup: any sequence of markers, tag texts and payload parses the same for every
// split, and tag text never reaches reasoning or content (the payload has no ASCII letters,
// every tag name has).
TEST(ChatOutputParser, RandomOutputsAreSplitInvariantAndNeverLeakMarkup) {
  const std::vector<std::string> tags = {"think",
                                         "response",
                                         "tools",
                                         "call tool=\"f\" index=\"1\"",
                                         "call",
                                         "argument key=\"k\" type=\"number\"",
                                         "argument key=\"s\" type=\"string\"",
                                         "json type=\"object\"",
                                         "message",
                                         "bogus"};
  const std::vector<std::string> payload = {"1",        " ",        "\n", "<",   "&",  "\"", "中",
                                            "\xf0\x9f", "\x9a\x80", "{}", "[2]", "<|", "|>"};
  std::mt19937_64 rng(11);
  size_t splits = 0;
  for (int iter = 0; iter < 120; ++iter) {
    Out out;
    for (int n = 4 + static_cast<int>(rng() % 14); n > 0; --n) {
      const auto k = rng() % 10;
      if (k < 3) {
        out.o(tags[rng() % tags.size()]);
      } else if (k < 5) {
        out.c(tags[rng() % tags.size()]);
      } else if (k == 5) {
        out.ctl(rng() % 3 == 0 ? kEndOfMsgToken : rng() % 2 ? kOpenToken : kSepToken);
      } else {
        out.t(payload[rng() % payload.size()]);
      }
    }
    ChatParserOptions opt;
    opt.thinking = rng() % 2 == 0;
    const ChatOutputEnd end = rng() % 2 ? kEnd : kCut;
    const ChatParsed ref = parse_chat_output(out.pieces, opt, end);
    for (const auto& field : {ref.reasoning_content, ref.content}) {
      if (!field) continue;
      EXPECT_TRUE(utf8_valid(*field));
      for (char ch : *field)
        ASSERT_FALSE((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'))
            << "markup leaked: '" << *field << "'";
    }
    splits += check_splits(out.pieces, opt, end, ref);
  }
  EXPECT_GT(splits, 10000u);
}

}  // namespace
}  // namespace attnres
