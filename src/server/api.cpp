// Request bodies of the OpenAI-compatible routes (api.h).
#include "server/api.h"

#include <cmath>
#include <limits>

namespace attnres::server {

using json = nlohmann::ordered_json;

ApiError api_error(int status, std::string message, std::string param, std::string code) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  if (status == 401) e.type = "authentication_error";
  if (status == 404) e.type = "not_found_error";
  if (status >= 500) e.type = status == 503 ? "unavailable_error" : "server_error";
  return e;
}

namespace {

// The leading JSON path of a message ("messages[2].role: ..."), or "".
std::string leading_path(const std::string& m) {
  const size_t colon = m.find(": ");
  if (colon == std::string::npos || colon == 0) return {};
  for (size_t i = 0; i < colon; ++i) {
    const char c = m[i];
    const bool ok =
        std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '[' || c == ']';
    if (!ok) return {};
  }
  return m.substr(0, colon);
}

}  // namespace

ApiError status_error(const Status& st) {
  switch (st.code()) {
    case ErrorCode::kContextLengthExceeded:
      return api_error(400, st.message(), "messages", "context_length_exceeded");
    case ErrorCode::kUnavailable:
      return api_error(503, st.message(), "", "server_busy");
    case ErrorCode::kResourceExhausted:
      return api_error(400, st.message(), "max_tokens", "kv_budget_exceeded");
    case ErrorCode::kInternal:
    case ErrorCode::kIoError:
    case ErrorCode::kCancelled:
      return api_error(500, st.message());
    case ErrorCode::kUnsupported:
      return api_error(400, st.message(), leading_path(st.message()), "unsupported");
    default:
      return api_error(400, st.message(), leading_path(st.message()));
  }
}

json error_json(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  err["code"] = e.code.empty() ? json(nullptr) : json(e.code);
  return {{"error", err}};
}

namespace {

std::string type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_float:
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "a number";
    default:
      return "binary data";
  }
}

std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return type_name(v) + " (" + s + ")";
}

// Field reader: each accessor returns false (and records the first error) on a bad value.
class Fields {
 public:
  explicit Fields(const json& body) : body_(body) {}
  const ApiError& error() const { return err_; }

  // The value of `key`, null when absent or null.
  const json* get(const char* key) const {
    auto it = body_.find(key);
    return it == body_.end() || it->is_null() ? nullptr : &*it;
  }
  bool fail(const std::string& param, const std::string& expected, const json& found) {
    return fail_msg(param, param + ": expected " + expected + ", found " + shown(found));
  }
  bool fail_msg(const std::string& param, std::string message) {
    err_ = api_error(400, std::move(message), param);
    return false;
  }

  bool boolean(const char* key, bool& out) {
    const json* v = get(key);
    if (v == nullptr) return true;
    if (!v->is_boolean()) return fail(key, "a boolean", *v);
    out = v->get<bool>();
    return true;
  }
  bool number(const char* key, double lo, double hi, bool open_lo, std::optional<double>& out) {
    const json* v = get(key);
    if (v == nullptr) return true;
    const std::string range = std::string(open_lo ? "(" : "[") + fmt(lo) + ", " + fmt(hi) + "]";
    if (!v->is_number()) return fail(key, "a number in " + range, *v);
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (open_lo && x == lo))
      return fail(key, "a number in " + range, *v);
    out = x;
    return true;
  }
  bool integer(const char* key, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
    const json* v = get(key);
    if (v == nullptr) return true;
    return integer_value(key, *v, lo, hi, out);
  }
  bool integer_value(const std::string& param, const json& v, int64_t lo, int64_t hi,
                     std::optional<int64_t>& out) {
    const std::string range =
        "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    int64_t x = 0;
    if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return fail(param, range, v);
      x = static_cast<int64_t>(u);
    } else if (v.is_number_float()) {
      const double d = v.get<double>();
      if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15)
        return fail(param, range, v);
      x = static_cast<int64_t>(d);
    } else {
      return fail(param, range, v);
    }
    if (x < lo || x > hi) return fail(param, range, v);
    out = x;
    return true;
  }
  bool string(const char* key, std::optional<std::string>& out) {
    const json* v = get(key);
    if (v == nullptr) return true;
    if (!v->is_string()) return fail(key, "a string", *v);
    out = v->get<std::string>();
    return true;
  }

 private:
  static std::string fmt(double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return b;
  }
  const json& body_;
  ApiError err_;
};

constexpr int kMaxStops = 16;
constexpr size_t kMaxStopBytes = 1024;

bool read_generation(Fields& f, const json& body, const ApiLimits& lim, bool chat,
                     GenerationFields& g) {
  std::optional<std::string> model;
  if (!f.string("model", model)) return false;
  g.model = model.value_or("");

  std::optional<double> x;
  if (!f.number("temperature", 0, 2, false, x)) return false;
  g.sampling.temperature = static_cast<float>(x.value_or(1.0));
  x.reset();
  if (!f.number("top_p", 0, 1, true, x)) return false;
  g.sampling.top_p = static_cast<float>(x.value_or(1.0));
  x.reset();
  if (!f.number("min_p", 0, 1, false, x)) return false;
  g.sampling.min_p = static_cast<float>(x.value_or(0.0));
  x.reset();
  if (!f.number("presence_penalty", -2, 2, false, x)) return false;
  g.sampling.presence_penalty = static_cast<float>(x.value_or(0.0));
  x.reset();
  if (!f.number("frequency_penalty", -2, 2, false, x)) return false;
  g.sampling.frequency_penalty = static_cast<float>(x.value_or(0.0));
  x.reset();
  if (!f.number("repetition_penalty", 0, 10, true, x)) return false;
  g.sampling.repetition_penalty = static_cast<float>(x.value_or(1.0));

  std::optional<int64_t> i;
  if (!f.integer("top_k", -1, 1 << 30, i)) return false;
  g.sampling.top_k = static_cast<int32_t>(std::max<int64_t>(0, i.value_or(0)));  // -1 = off
  i.reset();
  if (const json* v = f.get("seed")) {
    if (v->is_number_unsigned()) {
      g.sampling.seed = v->get<uint64_t>();
    } else {
      if (!f.integer("seed", std::numeric_limits<int64_t>::min(),
                     std::numeric_limits<int64_t>::max(), i))
        return false;
      g.sampling.seed = static_cast<uint64_t>(*i);
    }
    g.seed_given = true;
  }
  i.reset();

  // max_completion_tokens (the current name) wins over max_tokens (the deprecated one).
  const int64_t ctx_max = std::max<int64_t>(1, lim.context_length);
  std::optional<int64_t> mt, mct;
  if (!f.integer("max_tokens", 1, std::max<int64_t>(ctx_max, 1 << 30), mt)) return false;
  if (chat && !f.integer("max_completion_tokens", 1, std::max<int64_t>(ctx_max, 1 << 30), mct))
    return false;
  g.max_tokens = mct ? mct : mt;

  if (const json* v = f.get("n")) {
    std::optional<int64_t> n;
    if (!f.integer_value("n", *v, 1, 128, n)) return false;
    if (*n != 1)
      return f.fail_msg("n", "n: only 1 choice per request is supported, found " +
                                 std::to_string(*n) + " (send the request n times)");
  }
  if (const json* v = f.get("best_of")) {
    std::optional<int64_t> n;
    if (!f.integer_value("best_of", *v, 1, 128, n)) return false;
    if (*n != 1) return f.fail_msg("best_of", "best_of: only 1 is supported");
  }

  if (const json* v = f.get("stop")) {
    if (v->is_string()) {
      g.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (static_cast<int>(v->size()) > kMaxStops)
        return f.fail("stop", "at most " + std::to_string(kMaxStops) + " strings", *v);
      for (size_t k = 0; k < v->size(); ++k) {
        const json& s = (*v)[k];
        const std::string p = "stop[" + std::to_string(k) + "]";
        if (!s.is_string()) return f.fail(p, "a string", s);
        g.stop.push_back(s.get<std::string>());
      }
    } else {
      return f.fail("stop", "a string or an array of strings", *v);
    }
    for (size_t k = 0; k < g.stop.size(); ++k) {
      const std::string p = v->is_array() ? "stop[" + std::to_string(k) + "]" : "stop";
      if (g.stop[k].empty()) return f.fail_msg(p, p + ": an empty stop string would match at once");
      if (g.stop[k].size() > kMaxStopBytes)
        return f.fail_msg(p, p + ": longer than " + std::to_string(kMaxStopBytes) + " bytes");
    }
  }

  if (const json* v = f.get("logit_bias")) {
    if (!v->is_object()) return f.fail("logit_bias", "an object {token id: bias}", *v);
    for (auto it = v->begin(); it != v->end(); ++it) {
      const std::string p = "logit_bias." + it.key();
      const std::string& k = it.key();
      int64_t id = -1;
      bool digits = !k.empty() && k.size() <= 10;
      for (char c : k) digits = digits && c >= '0' && c <= '9';
      if (digits) id = std::stoll(k);
      if (!digits || id >= lim.vocab_size)
        return f.fail_msg(
            p, p + ": the key must be a token id in [0, " + std::to_string(lim.vocab_size) + ")");
      const json& b = it.value();
      if (!b.is_number() || !std::isfinite(b.get<double>()) || b.get<double>() < -100 ||
          b.get<double>() > 100)
        return f.fail(p, "a number in [-100, 100]", b);
      g.logit_bias.emplace_back(static_cast<int32_t>(id), b.get<float>());
    }
  }

  if (chat) {
    bool logprobs = false;
    if (!f.boolean("logprobs", logprobs)) return false;
    if (!f.integer("top_logprobs", 0, 20, i)) return false;
    if (i && !logprobs) return f.fail_msg("top_logprobs", "top_logprobs: needs \"logprobs\": true");
    g.top_logprobs = logprobs ? static_cast<int>(i.value_or(0)) : -1;
  } else if (const json* v = f.get("logprobs")) {
    if (!f.integer_value("logprobs", *v, 0, 20, i)) return false;
    g.top_logprobs = static_cast<int>(*i);
  }
  i.reset();

  if (!f.boolean("stream", g.stream)) return false;
  if (const json* v = f.get("stream_options")) {
    if (!v->is_object()) return f.fail("stream_options", "an object", *v);
    if (!g.stream)
      return f.fail_msg("stream_options", "stream_options: only allowed with \"stream\": true");
    auto it = v->find("include_usage");
    if (it != v->end() && !it->is_null()) {
      if (!it->is_boolean()) return f.fail("stream_options.include_usage", "a boolean", *it);
      g.include_usage = it->get<bool>();
    }
  }
  if (!f.boolean("cache_prompt", g.cache_prompt)) return false;
  if (!f.boolean("ignore_eos", g.ignore_eos)) return false;
  if (const json* v = f.get("attnres_forced_output")) {
    if (!lim.allow_forced_output)
      return f.fail_msg("attnres_forced_output",
                        "attnres_forced_output: a test feature; the server was not started with "
                        "--test-forced-output");
    if (!v->is_string()) return f.fail("attnres_forced_output", "a string", *v);
    g.forced_output = v->get<std::string>();
  }
  (void)body;
  return true;
}

// The deepest nesting of arrays and objects (outside strings): what is refused before parsing,
// since rendering and dumping walk values recursively.
constexpr int kMaxDepth = 128;
int nesting_depth(std::string_view body) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    if (c == '[' || c == '{') deepest = std::max(deepest, ++depth);
    if (c == ']' || c == '}') --depth;
  }
  return deepest;
}

}  // namespace

Parsed<json> parse_json_body(std::string_view content_type, std::string_view body) {
  Parsed<json> out;
  std::string_view media = content_type.substr(0, content_type.find(';'));
  while (!media.empty() && media.back() == ' ') media.remove_suffix(1);
  std::string lower(media);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower != "application/json") {
    out.error = api_error(
        415, "Content-Type is '" + std::string(content_type) + "', expected application/json", "",
        "unsupported_media_type");
    return out;
  }
  if (body.empty()) {
    out.error = api_error(400, "the request body is empty, expected a JSON object");
    return out;
  }
  if (nesting_depth(body) > kMaxDepth) {
    out.error = api_error(400,
                          "the request body nests arrays and objects deeper than " +
                              std::to_string(kMaxDepth) + " levels",
                          "", "invalid_json");
    return out;
  }
  json v = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) {
    // Find where: parse again with exceptions for the position and reason.
    std::string why = "not valid JSON";
    try {
      const json again = json::parse(body.begin(), body.end());
    } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e9999
      why = e.what();
      if (const size_t p = why.find("parse error"); p != std::string::npos) why = why.substr(p);
    }
    out.error = api_error(400, "the request body is not valid JSON: " + why, "", "invalid_json");
    return out;
  }
  if (!v.is_object()) {
    out.error = api_error(400, "the request body is " + type_name(v) + ", expected a JSON object");
    return out;
  }
  out.value = std::move(v);
  return out;
}

Parsed<ChatCompletionRequest> parse_chat_completion(const json& body, const ApiLimits& lim) {
  Parsed<ChatCompletionRequest> out;
  Fields f(body);
  ChatCompletionRequest r;
  const json* m = f.get("messages");
  if (m == nullptr) {
    out.error = api_error(400, "messages: missing (a chat completion needs a list of messages)",
                          "messages");
    return out;
  }
  if (!m->is_array() || m->empty()) {
    f.fail("messages", "a non-empty array of messages", *m);
    out.error = f.error();
    return out;
  }
  if (!read_generation(f, body, lim, /*chat=*/true, r.gen)) {
    out.error = f.error();
    return out;
  }
  r.body = body;
  out.value = std::move(r);
  return out;
}

Parsed<CompletionRequest> parse_completion(const json& body, const ApiLimits& lim) {
  Parsed<CompletionRequest> out;
  Fields f(body);
  CompletionRequest r;
  const json* p = f.get("prompt");
  auto fail = [&](std::string msg) {
    out.error = api_error(400, std::move(msg), "prompt");
    return out;
  };
  if (p == nullptr) return fail("prompt: missing (a string or an array of token ids)");
  // A list holding one prompt is that prompt; several prompts in one request are refused.
  const json* one = p;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array()))
    one = &(*p)[0];
  if (one->is_string()) {
    r.prompt_text = one->get<std::string>();
    if (r.prompt_text->empty()) return fail("prompt: empty");
  } else if (one->is_array()) {
    if (one->empty()) return fail("prompt: an empty array");
    for (size_t k = 0; k < one->size(); ++k) {
      const json& t = (*one)[k];
      if (t.is_string() || t.is_array())
        return fail(
            "prompt: several prompts in one request are not supported; send one "
            "request per prompt");
      std::optional<int64_t> id;
      if (!f.integer_value("prompt[" + std::to_string(k) + "]", t, 0, lim.vocab_size - 1, id)) {
        out.error = f.error();
        return out;
      }
      r.prompt_ids.push_back(static_cast<int32_t>(*id));
    }
  } else {
    f.fail("prompt", "a string or an array of token ids", *p);
    out.error = f.error();
    return out;
  }
  if (!read_generation(f, body, lim, /*chat=*/false, r.gen) || !f.boolean("echo", r.echo)) {
    out.error = f.error();
    return out;
  }
  if (const json* s = f.get("suffix")) {
    if (!s->is_string() || !s->get<std::string>().empty()) {
      out.error =
          api_error(400, "suffix: not supported (no fill-in-the-middle)", "suffix", "unsupported");
      return out;
    }
  }
  if (!r.gen.max_tokens) r.gen.max_tokens = 16;  // the OpenAI default of this route
  out.value = std::move(r);
  return out;
}

Parsed<TokenizeRequest> parse_tokenize(const json& body) {
  Parsed<TokenizeRequest> out;
  Fields f(body);
  TokenizeRequest r;
  std::optional<std::string> content, prompt;
  bool add_special = false, parse_special = false;
  if (!f.string("content", content) || !f.string("prompt", prompt) ||
      !f.boolean("add_special", add_special) || !f.boolean("parse_special", parse_special) ||
      !f.boolean("with_pieces", r.with_pieces)) {
    out.error = f.error();
    return out;
  }
  r.allow_special = add_special || parse_special;
  r.text = content ? content : prompt;
  if (const json* m = f.get("messages")) {
    if (r.text) {
      out.error =
          api_error(400, "messages: give either text (content/prompt) or messages", "messages");
      return out;
    }
    if (!m->is_array() || m->empty()) {
      f.fail("messages", "a non-empty array of messages", *m);
      out.error = f.error();
      return out;
    }
    r.chat_body = body;
  }
  if (!r.text && !r.chat_body) {
    out.error = api_error(400, "content: missing (the text to tokenize, or messages)", "content");
    return out;
  }
  out.value = std::move(r);
  return out;
}

Parsed<DetokenizeRequest> parse_detokenize(const json& body, const ApiLimits& lim) {
  Parsed<DetokenizeRequest> out;
  Fields f(body);
  DetokenizeRequest r;
  const json* t = f.get("tokens");
  if (t == nullptr) {
    out.error = api_error(400, "tokens: missing (an array of token ids)", "tokens");
    return out;
  }
  if (!t->is_array()) {
    f.fail("tokens", "an array of token ids", *t);
    out.error = f.error();
    return out;
  }
  for (size_t k = 0; k < t->size(); ++k) {
    std::optional<int64_t> id;
    if (!f.integer_value("tokens[" + std::to_string(k) + "]", (*t)[k], 0, lim.vocab_size - 1, id)) {
      out.error = f.error();
      return out;
    }
    r.tokens.push_back(static_cast<int32_t>(*id));
  }
  out.value = std::move(r);
  return out;
}

bool bearer_matches(std::string_view header, std::string_view key) {
  constexpr std::string_view kPrefix = "Bearer ";
  // Every byte of the longer of the two is looked at whatever matches; the result is folded
  // into one accumulator without early exit.
  const std::string_view got =
      header.size() >= kPrefix.size() ? header.substr(kPrefix.size()) : std::string_view();
  unsigned diff = header.size() >= kPrefix.size() ? 0u : 1u;
  for (size_t i = 0; i < kPrefix.size() && i < header.size(); ++i)
    diff |= static_cast<unsigned char>(header[i]) ^ static_cast<unsigned char>(kPrefix[i]);
  const size_t n = std::max(got.size(), key.size());
  diff |= static_cast<unsigned>(got.size() != key.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char a = i < got.size() ? static_cast<unsigned char>(got[i]) : 0;
    const unsigned char b = i < key.size() ? static_cast<unsigned char>(key[i]) : 0;
    diff |= a ^ b;
  }
  return diff == 0 && !key.empty();
}

}  // namespace attnres::server
