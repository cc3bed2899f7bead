// Every client mistake is a 4xx whose message names the field, never a 500 and never a crash:
// a table of bad requests sent over real HTTP to a served models/kjv, each checked for its
// status, its error code where it has one, and the field named in the message and in `param`.
#include <string>
#include <vector>

#include "server/api.h"
#include "server_util.h"

namespace attnres::server::test {
namespace {

struct BadCase {
  BadCase(const char* n, std::string r, int st, std::string f, bool p = false, std::string c = {})
      : name(n), raw(std::move(r)), status(st), field(std::move(f)), param(p), code(std::move(c)) {}
  const char* name;
  std::string raw;    // the whole HTTP request
  int status;         // expected status
  std::string field;  // expected in the message (and == error.param when `param`)
  bool param;         // the JSON error's param must be `field`
  std::string code;   // expected error.code ("" = not checked)
};

std::string chat(const std::string& fields) {
  return request("POST", "/v1/chat/completions",
                 R"({"messages":[{"role":"user","content":"In the beginning"}],"max_tokens":4)" +
                     (fields.empty() ? "" : "," + fields) + "}");
}
std::string chat_messages(const std::string& messages) {
  return request("POST", "/v1/chat/completions", R"({"max_tokens":4,"messages":)" + messages + "}");
}
std::string completion(const std::string& body) {
  return request("POST", "/v1/completions", body);
}

std::vector<BadCase> cases() {
  const std::string big(70 << 10, 'a');
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += "[";
  for (int i = 0; i < 200; ++i) deep += "]";
  std::string seventeen = "[";
  for (int i = 0; i < 17; ++i)
    seventeen += std::string(i ? "," : "") + "\"s" + std::to_string(i) + "\"";
  seventeen += "]";
  std::string long_prompt;
  for (int i = 0; i < 400; ++i) long_prompt += "and the LORD said ";
  return {
      // Framing, content type, JSON.
      {"bad_json", request("POST", "/v1/chat/completions", R"({"messages": [)"), 400, "JSON", false,
       "invalid_json"},
      {"body_is_array", request("POST", "/v1/chat/completions", "[1,2]"), 400, "JSON object"},
      // A number beyond double's range is a JSON error, not an exception out of the parser.
      {"number_overflow",
       request("POST", "/v1/chat/completions", R"({"messages": [], "temperature": 2e2452})"), 400,
       "number overflow", false, "invalid_json"},
      {"empty_body", request("POST", "/v1/chat/completions", ""), 400, "empty"},
      {"text_plain", request("POST", "/v1/chat/completions", "{}", "text/plain"), 415,
       "Content-Type", false, "unsupported_media_type"},
      {"no_content_type", request("POST", "/v1/chat/completions", "{}", ""), 415, "Content-Type"},
      {"invalid_utf8",
       request("POST", "/v1/chat/completions",
               "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"),
       400, "UTF-8"},
      {"body_too_large", request("POST", "/v1/chat/completions", "{\"x\":\"" + big + "\"}"), 413,
       "exceeds the limit"},
      {"header_too_large",
       "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(80 << 10, 'h') + "\r\n\r\n",
       431, "header"},
      {"garbage_request_line", "GARBAGE\r\n\r\n", 400, "malformed HTTP"},
      {"unknown_route", request("GET", "/v2/nothing"), 404, "/v2/nothing"},
      {"wrong_method", request("GET", "/v1/chat/completions"), 405, "POST"},
      {"nested_too_deep", request("POST", "/v1/chat/completions", "{\"x\":" + deep + "}"), 400,
       "deeper"},
      // Messages.
      {"messages_missing", request("POST", "/v1/chat/completions", R"({"max_tokens":4})"), 400,
       "messages", true},
      {"messages_not_array", chat_messages(R"("hello")"), 400, "messages", true},
      {"messages_empty", chat_messages("[]"), 400, "messages", true},
      {"message_not_object", chat_messages(R"(["hi"])"), 400, "messages[0]", true},
      {"role_missing", chat_messages(R"([{"content":"hi"}])"), 400, "messages[0].role", true},
      {"role_unknown", chat_messages(R"([{"role":"wizard","content":"hi"}])"), 400,
       "messages[0].role", true},
      {"content_number", chat_messages(R"([{"role":"user","content":5}])"), 400,
       "messages[0].content", true},
      {"content_image_part",
       chat_messages(
           R"([{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}])"),
       400, "messages[0].content"},
      {"tool_call_without_name",
       chat_messages(
           R"([{"role":"user","content":"hi"},{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"arguments":"{}"}}]}])"),
       400, "messages[1].tool_calls[0].function"},
      // Sampling fields.
      {"temperature_string", chat(R"("temperature":"hot")"), 400, "temperature", true},
      {"temperature_high", chat(R"("temperature":3)"), 400, "temperature", true},
      {"temperature_negative", chat(R"("temperature":-1)"), 400, "temperature", true},
      {"top_p_zero", chat(R"("top_p":0)"), 400, "top_p", true},
      {"top_p_high", chat(R"("top_p":1.5)"), 400, "top_p", true},
      {"top_k_string", chat(R"("top_k":"5")"), 400, "top_k", true},
      {"top_k_negative", chat(R"("top_k":-2)"), 400, "top_k", true},
      {"min_p_high", chat(R"("min_p":2)"), 400, "min_p", true},
      {"presence_penalty_high", chat(R"("presence_penalty":5)"), 400, "presence_penalty", true},
      {"frequency_penalty_low", chat(R"("frequency_penalty":-3)"), 400, "frequency_penalty", true},
      {"repetition_penalty_zero", chat(R"("repetition_penalty":0)"), 400, "repetition_penalty",
       true},
      {"max_tokens_zero",
       request("POST", "/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})"),
       400, "max_tokens", true},
      {"max_tokens_fraction",
       request("POST", "/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"x"}],"max_tokens":1.5})"),
       400, "max_tokens", true},
      {"max_tokens_string",
       request("POST", "/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"x"}],"max_tokens":"10"})"),
       400, "max_tokens", true},
      {"max_completion_tokens_negative", chat(R"("max_completion_tokens":-1)"), 400,
       "max_completion_tokens", true},
      {"seed_string", chat(R"("seed":"abc")"), 400, "seed", true},
      {"seed_fraction", chat(R"("seed":1.5)"), 400, "seed", true},
      {"stop_number", chat(R"("stop":5)"), 400, "stop", true},
      {"stop_item_number", chat(R"("stop":[1])"), 400, "stop[0]", true},
      {"stop_item_empty", chat(R"("stop":[""])"), 400, "stop[0]", true},
      {"stop_too_many", chat("\"stop\":" + seventeen), 400, "stop", true},
      {"logit_bias_array", chat(R"("logit_bias":[1])"), 400, "logit_bias", true},
      {"logit_bias_key", chat(R"("logit_bias":{"abc":1})"), 400, "logit_bias.abc", true},
      {"logit_bias_out_of_vocab", chat(R"("logit_bias":{"999999":1})"), 400, "logit_bias.999999",
       true},
      {"logit_bias_value", chat(R"("logit_bias":{"5":200})"), 400, "logit_bias.5", true},
      {"logprobs_string", chat(R"("logprobs":"yes")"), 400, "logprobs", true},
      {"top_logprobs_high", chat(R"("logprobs":true,"top_logprobs":21)"), 400, "top_logprobs",
       true},
      {"top_logprobs_without_logprobs", chat(R"("top_logprobs":2)"), 400, "top_logprobs", true},
      {"stream_string", chat(R"("stream":"true")"), 400, "stream", true},
      {"stream_options_without_stream", chat(R"("stream_options":{"include_usage":true})"), 400,
       "stream_options", true},
      {"include_usage_string", chat(R"("stream":true,"stream_options":{"include_usage":"x"})"), 400,
       "stream_options.include_usage", true},
      {"n_two", chat(R"("n":2)"), 400, "n", true},
      {"model_number", chat(R"("model":5)"), 400, "model", true},
      {"cache_prompt_string", chat(R"("cache_prompt":"no")"), 400, "cache_prompt", true},
      {"forced_output_without_flag", chat(R"("attnres_forced_output":"x")"), 400,
       "attnres_forced_output", true},
      // Template fields.
      {"tools_not_array", chat(R"("tools":"x")"), 400, "tools"},
      {"tool_choice_named",
       chat(
           R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"f"}})"),
       400, "tool_choice", false, "unsupported"},
      {"response_format_type", chat(R"("response_format":{"type":"xml"})"), 400, "response_format"},
      {"thinking_string", chat(R"("chat_template_kwargs":{"thinking":"yes"})"), 400,
       "chat_template_kwargs.thinking"},
      {"reasoning_effort_medium", chat(R"("reasoning_effort":"medium")"), 400, "reasoning_effort"},
      // Context.
      {"max_tokens_over_context",
       request("POST", "/v1/chat/completions",
               R"({"messages":[{"role":"user","content":"x"}],"max_tokens":10000})"),
       400, "maximum context length", false, "context_length_exceeded"},
      {"prompt_over_context",
       request("POST", "/v1/chat/completions",
               R"({"messages":[{"role":"user","content":")" + long_prompt + R"("}]})"),
       400, "maximum context length", false, "context_length_exceeded"},
      // Completions.
      {"prompt_missing", completion(R"({"max_tokens":4})"), 400, "prompt", true},
      {"prompt_number", completion(R"({"prompt":5})"), 400, "prompt", true},
      {"prompt_empty_array", completion(R"({"prompt":[]})"), 400, "prompt", true},
      {"prompt_id_out_of_vocab", completion(R"({"prompt":[1,999999]})"), 400, "prompt[1]", true},
      {"prompt_id_negative", completion(R"({"prompt":[-1]})"), 400, "prompt[0]", true},
      {"prompt_several", completion(R"({"prompt":["a","b"]})"), 400, "prompt", true},
      {"completion_logprobs_high", completion(R"({"prompt":"a","logprobs":21})"), 400, "logprobs",
       true},
      {"suffix", completion(R"({"prompt":"a","suffix":"b"})"), 400, "suffix", true},
      {"echo_string", completion(R"({"prompt":"a","echo":"yes"})"), 400, "echo", true},
      {"completion_over_context", completion(R"({"prompt":"a","max_tokens":300})"), 400,
       "maximum context length", false, "context_length_exceeded"},
      // Tokenizer routes.
      {"tokenize_missing", request("POST", "/tokenize", "{}"), 400, "content", true},
      {"tokenize_number", request("POST", "/tokenize", R"({"content":5})"), 400, "content", true},
      {"detokenize_missing", request("POST", "/detokenize", "{}"), 400, "tokens", true},
      {"detokenize_string_id", request("POST", "/detokenize", R"({"tokens":["a"]})"), 400,
       "tokens[0]", true},
      {"detokenize_out_of_vocab", request("POST", "/detokenize", R"({"tokens":[5000000]})"), 400,
       "tokens[0]", true},
      {"apply_template_missing", request("POST", "/apply-template", R"({"x":1})"), 400, "messages"},
  };
}

class BadRequests : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ServerOptions o = kjv_options();
    o.max_body_bytes = 64 << 10;
    server_ = new TestServer(o);
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static TestServer* server_;
};
TestServer* BadRequests::server_ = nullptr;

TEST_F(BadRequests, EachIsA4xxNamingTheField) {
  const std::vector<BadCase> all = cases();
  ASSERT_GE(all.size(), 40u);
  for (const BadCase& c : all) {
    SCOPED_TRACE(c.name);
    const Reply r = call(server_->port(), c.raw);
    EXPECT_EQ(r.status, c.status) << r.body;
    EXPECT_GE(r.status, 400);
    EXPECT_LT(r.status, 500);
    if (r.header("content-type") == "application/json") {
      const json j = r.body_json();
      ASSERT_TRUE(j.is_object()) << r.body;
      ASSERT_TRUE(j.contains("error")) << r.body;
      const json& e = j["error"];
      ASSERT_TRUE(e["message"].is_string());
      EXPECT_NE(e["message"].get<std::string>().find(c.field), std::string::npos) << e["message"];
      EXPECT_TRUE(e["type"].is_string());
      if (c.param) {
        EXPECT_EQ(e["param"], c.field) << r.body;
      }
      if (!c.code.empty()) {
        EXPECT_EQ(e["code"], c.code) << r.body;
      }
    } else {
      EXPECT_NE(r.body.find(c.field), std::string::npos) << r.body;
    }
  }
  // The server is still there and well after all of them.
  EXPECT_EQ(get(server_->port(), "/health").status, 200);
  const Reply ok = post(server_->port(), "/v1/chat/completions", chat_body("Jesus wept", false, 3));
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST(ServeAuth, ApiKeyIsRequiredExceptForHealth) {
  ServerOptions o = kjv_options();
  o.api_key = "sk-test-123";
  TestServer s(o);
  const std::string body = chat_body("In the beginning", false, 2).dump();
  struct AuthCase {
    const char* name;
    std::string header;
    int status;
  };
  const AuthCase auth[] = {
      {"missing", "", 401},
      {"wrong_key", "Authorization: Bearer sk-test-124\r\n", 401},
      {"prefix_of_key", "Authorization: Bearer sk-test-12\r\n", 401},
      {"longer_key", "Authorization: Bearer sk-test-1234\r\n", 401},
      {"basic_scheme", "Authorization: Basic sk-test-123\r\n", 401},
      {"right_key", "Authorization: Bearer sk-test-123\r\n", 200},
  };
  for (const AuthCase& c : auth) {
    SCOPED_TRACE(c.name);
    const Reply r =
        call(s.port(), request("POST", "/v1/chat/completions", body, "application/json", c.header));
    EXPECT_EQ(r.status, c.status) << r.body;
    if (c.status == 401) {
      EXPECT_EQ(r.body_json()["error"]["code"], "invalid_api_key");
      EXPECT_EQ(r.body_json()["error"]["type"], "authentication_error");
    }
  }
  EXPECT_EQ(get(s.port(), "/v1/models").status, 401);
  EXPECT_EQ(get(s.port(), "/metrics").status, 401);
  EXPECT_EQ(get(s.port(), "/health").status, 200);
}

TEST(ServeAuth, BearerCompareIsExact) {
  EXPECT_TRUE(bearer_matches("Bearer abc", "abc"));
  EXPECT_FALSE(bearer_matches("Bearer abd", "abc"));
  EXPECT_FALSE(bearer_matches("Bearer ab", "abc"));
  EXPECT_FALSE(bearer_matches("Bearer abcd", "abc"));
  EXPECT_FALSE(bearer_matches("bearer abc", "abc"));
  EXPECT_FALSE(bearer_matches("Bearer", "abc"));
  EXPECT_FALSE(bearer_matches("", "abc"));
  EXPECT_FALSE(bearer_matches("Bearer ", ""));
  std::string with_nul = "Bearer ab";
  with_nul.push_back('\0');
  EXPECT_FALSE(bearer_matches(with_nul, "ab"));
}

}  // namespace
}  // namespace attnres::server::test
