// The C++ chat renderer against the published Kimi-K3 template rendered by jinja2, at test time.
//
// tests/scripts/chat_template_reference.py generates seeded random requests (every feature the
// template renders; its "features" list says which case has which), maps each to the template's
// variables as the server does, renders it with jinja2 (configured as transformers does) and
// writes the text or the template's error. Here each request goes through parse_chat_request and
// render_chat_request and must give the same bytes (or an error where the template raised). The
// script also writes Python's repr() of 20,000 doubles and str.lower() of every code point it
// changes, for the number formatting and key sorting on their own.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "tokenizer/chat.h"
#include "tokenizer/utf8.h"

namespace attnres {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

constexpr int kSeed = 13;
constexpr int kCases = 300;

// The interpreter that runs the reference: Debian's python3 (with python3-jinja2) first.
std::string find_python() {
  for (const char* py : {"/usr/bin/python3", "python3"}) {
    const std::string probe = std::string(py) + " -c 'import jinja2' >/dev/null 2>&1";
    if (std::system(probe.c_str()) == 0) return py;
  }
  return "";
}

struct Reference {
  std::string error;  // why the reference could not be produced
  std::vector<Json> cases;
  std::vector<std::string> floats;
  Json lower;
};

const Reference& reference() {
  static const Reference ref = [] {
    Reference r;
    const std::string py = find_python();
    if (py.empty()) {
      r.error =
          "no python3 with jinja2 found (Debian: python3-jinja2; run scripts/install-deps.sh)";
      return r;
    }
    const fs::path out =
        fs::temp_directory_path() / ("attnres_chat_ref_" + std::to_string(::getpid()) + ".jsonl");
    const std::string cmd =
        py + " " + ATTNRES_SOURCE_DIR + "/tests/scripts/chat_template_reference.py --template " +
        ATTNRES_FIXTURES_DIR + "/kimi-k3/chat_template.jinja --seed " + std::to_string(kSeed) +
        " --count " + std::to_string(kCases) + " --out " + out.string();
    if (std::system(cmd.c_str()) != 0) {
      r.error = "reference script failed: " + cmd;
      return r;
    }
    std::ifstream in(out);
    std::string line;
    while (std::getline(in, line)) {
      Json j = Json::parse(line);
      if (j.contains("case")) {
        r.cases.push_back(std::move(j));
      } else if (j.contains("floats")) {
        r.floats = j["floats"].get<std::vector<std::string>>();
      } else if (j.contains("lower")) {
        r.lower = std::move(j["lower"]);
      }
    }
    fs::remove(out);
    return r;
  }();
  return ref;
}

// Bytes around position `at`, with control characters escaped, for a readable diff.
std::string excerpt(const std::string& s, size_t at) {
  // Whole UTF-8 characters only: move the ends off continuation bytes.
  const auto continuation = [&](size_t i) { return i < s.size() && (s[i] & 0xC0) == 0x80; };
  size_t begin = at > 60 ? at - 60 : 0;
  while (begin > 0 && continuation(begin)) --begin;
  size_t end = std::min(s.size(), at + 60);
  while (continuation(end)) ++end;
  std::string out;
  for (size_t i = begin; i < end; ++i) {
    if (i == at) out += "[HERE]";
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::string first_difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  return "first differing byte at offset " + std::to_string(i) + " (jinja2 " +
         std::to_string(want.size()) + " bytes, C++ " + std::to_string(got.size()) +
         " bytes)\n  jinja2: " + excerpt(want, i) + "\n  C++:    " + excerpt(got, i);
}

const Tokenizer& synth() {
  static const Tokenizer t = [] {
    auto r = Tokenizer::load(std::string(ATTNRES_FIXTURES_DIR) + "/tokenizer/synthetic",
                             PreTokenizer::kKimi);
    if (!r) ADD_FAILURE() << r.status().to_string();
    return std::move(r).value();
  }();
  return t;
}

TEST(ChatTemplateParity, RandomRequestsRenderLikeJinja2) {
  const Reference& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  ASSERT_EQ(ref.cases.size(), static_cast<size_t>(kCases));
  std::map<std::string, int> features;
  int rendered = 0;
  int refused = 0;
  for (const Json& c : ref.cases) {
    for (const auto& f : c["features"]) ++features[f.get<std::string>()];
    ChatRequestOptions options;
    options.parse_string_arguments = c["parse_string_arguments"].get<bool>();
    const std::string where =
        "case " + std::to_string(c["case"].get<int>()) +
        " (parse_string_arguments=" + (options.parse_string_arguments ? "true" : "false") +
        "), request:\n" + c["request"].dump(1, ' ', false, Json::error_handler_t::replace);
    auto request = parse_chat_request(c["request"], options);
    Result<std::vector<ChatSegment>> segments =
        request ? render_chat_request(*request)
                : Result<std::vector<ChatSegment>>(request.status());
    if (!c["error"].is_null()) {
      EXPECT_FALSE(segments.is_ok()) << "jinja2 raised \"" << c["error"].get<std::string>()
                                     << "\" but C++ rendered; " << where;
      ++refused;
      continue;
    }
    ASSERT_TRUE(segments.is_ok()) << segments.status().to_string() << "\n" << where;
    const std::string want = c["text"].get<std::string>();
    const std::string got = chat_segments_text(*segments);
    ASSERT_EQ(got == want, true) << first_difference(want, got) << "\n" << where;
    ++rendered;
    // Token ids: exactly the control segments become control tokens, and the ids decode to the
    // rendered text (user text that spells a marker stays text).
    auto ids = encode_chat_segments(synth(), *segments);
    ASSERT_TRUE(ids.is_ok()) << ids.status().to_string();
    size_t controls = 0;
    for (const ChatSegment& s : *segments) controls += s.control ? 1 : 0;
    size_t control_ids = 0;
    for (TokenId id : *ids) control_ids += synth().is_special(id) ? 1 : 0;
    EXPECT_EQ(control_ids, controls) << where;
    EXPECT_EQ(*synth().decode_bytes(*ids), want) << where;
  }
  EXPECT_GE(rendered, 200);
  EXPECT_GE(refused, 5);
  // The generator must really cover every feature (a coverage guard, not a reference).
  for (const char* f : {"system",
                        "named",
                        "multi_turn",
                        "reasoning_content",
                        "reasoning",
                        "blank_reasoning",
                        "tools",
                        "dynamic_tools",
                        "tool_calls",
                        "flat_tool_call",
                        "arg_string",
                        "arg_number",
                        "arg_boolean",
                        "arg_null",
                        "arg_object",
                        "arg_array",
                        "json_string_arguments",
                        "raw_json_block",
                        "xtml_json_block",
                        "tool_result_by_id",
                        "tool_result_by_id_reordered",
                        "tool_result_by_order",
                        "tool_result_named",
                        "tool_result_unresolved",
                        "tool_choice_none",
                        "tool_choice_required",
                        "response_format_json_object",
                        "response_format_json_schema",
                        "thinking_on",
                        "thinking_off",
                        "effort_low",
                        "effort_high",
                        "effort_max",
                        "effort_null",
                        "effort_unsupported",
                        "add_generation_prompt_false",
                        "attr_escape",
                        "non_ascii",
                        "content_parts",
                        "template_error"})
    EXPECT_GE(features[f], 5) << "feature " << f << " is generated too rarely";
}

TEST(ChatTemplateParity, FloatsFormatLikePythonRepr) {
  const Reference& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  ASSERT_GE(ref.floats.size(), 20000u);
  for (const std::string& want : ref.floats) {
    const double x = std::strtod(want.c_str(), nullptr);
    ASSERT_EQ(python_float_repr(x), want);
    // Through nlohmann, as a request's number reaches the renderer.
    ASSERT_EQ(python_json_dumps(Json::parse(want)), want);
  }
}

TEST(ChatTemplateParity, LowercaseLikePython) {
  const Reference& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  ASSERT_GT(ref.lower.size(), 1000u);
  std::set<uint32_t> changed;
  for (const auto& e : ref.lower) {
    const auto cp = e[0].get<uint32_t>();
    std::string in;
    std::string want;
    append_utf8(cp, in);
    for (const auto& c : e[1]) append_utf8(c.get<uint32_t>(), want);
    ASSERT_EQ(python_lower(in), want) << "U+" << std::hex << cp;
    changed.insert(cp);
  }
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    if ((cp >= 0xD800 && cp <= 0xDFFF) || changed.count(cp)) continue;
    std::string s;
    append_utf8(cp, s);
    ASSERT_EQ(python_lower(s), s) << "U+" << std::hex << cp;
  }
}

}  // namespace
}  // namespace attnres
