// parse_chat_request: every client mistake is a Status of the right class whose message names
// the field (a JSON path) and says what was expected and what was found. Table-driven: each row
// changes one thing in an otherwise valid request.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/chat.h"

namespace attnres {
namespace {

using Json = nlohmann::ordered_json;

struct BadRequest {
  ErrorCode code;
  const char* message;  // a substring the message must contain
};

// A user turn, an assistant turn with one call, its result.
constexpr const char* kUser = R"({"role": "user", "content": "hi"})";

std::string with_messages(const std::string& messages, const std::string& extra = "") {
  return R"({"model": "k3", "messages": )" + messages + (extra.empty() ? "" : ", " + extra) + "}";
}

TEST(ChatRequest, ClientMistakesAreNamedErrors) {
  const std::string u = kUser;
  const std::string call = R"({"role": "assistant", "content": null, "tool_calls": [)";
  const std::vector<std::pair<std::string, BadRequest>> rows = {
      {"[]", {ErrorCode::kWrongType, "request body: expected a JSON object, found an array"}},
      {R"({"model": "k3"})", {ErrorCode::kMissingField, "messages: missing"}},
      {R"({"messages": {}})",
       {ErrorCode::kWrongType, "messages: expected an array of messages, found an object"}},
      {R"({"messages": []})", {ErrorCode::kInvalidValue, "messages: expected a non-empty"}},
      {with_messages("[5]"),
       {ErrorCode::kWrongType, "messages[0]: expected a message object, found a number"}},
      {with_messages(R"([{"content": "x"}])"),
       {ErrorCode::kMissingField, "messages[0].role: missing"}},
      {with_messages(R"([{"role": 1, "content": "x"}])"),
       {ErrorCode::kWrongType, "messages[0].role: expected a string, found a number"}},
      {with_messages(R"([{"role": "developer", "content": "x"}])"),
       {ErrorCode::kInvalidValue,
        "messages[0].role: unknown role \"developer\" (expected system, user, assistant or tool)"}},
      {with_messages(R"([{"role": "user"}])"),
       {ErrorCode::kMissingField, "messages[0].content: missing (expected a string or an array"}},
      {with_messages(R"([{"role": "system", "content": null}])"),
       {ErrorCode::kMissingField, "messages[0].content: missing"}},
      {with_messages(R"([{"role": "user", "content": 7}])"),
       {ErrorCode::kWrongType,
        "messages[0].content: expected a string or an array of text parts, found a number"}},
      {with_messages(R"([{"role": "user", "content": ["x"]}])"),
       {ErrorCode::kWrongType, "messages[0].content[0]: expected an object"}},
      {with_messages(
           R"([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}])"),
       {ErrorCode::kUnsupported,
        "messages[0].content[1].type: content parts of type \"image_url\" are not supported"}},
      {with_messages(R"([{"role": "user", "content": [{"text": "a"}]}])"),
       {ErrorCode::kMissingField, "messages[0].content[0].type: missing"}},
      {with_messages(R"([{"role": "user", "content": [{"type": "text"}]}])"),
       {ErrorCode::kMissingField, "messages[0].content[0].text: missing"}},
      {with_messages(R"([{"role": "user", "content": [{"type": "text", "text": 3}]}])"),
       {ErrorCode::kWrongType, "messages[0].content[0].text: expected a string, found a number"}},
      {with_messages(R"([{"role": "user", "content": "x", "name": 5}])"),
       {ErrorCode::kWrongType, "messages[0].name: expected a string, found a number"}},
      {with_messages("[" + u +
                     R"(, {"role": "assistant", "content": "x", "reasoning_content": 1}])"),
       {ErrorCode::kWrongType, "messages[1].reasoning_content: expected a string"}},
      {with_messages("[" + u + R"(, {"role": "assistant", "tool_calls": {}}])"),
       {ErrorCode::kWrongType, "messages[1].tool_calls: expected an array of tool calls"}},
      {with_messages("[" + u + ", " + call + "3]}]"),
       {ErrorCode::kWrongType, "messages[1].tool_calls[0]: expected an object"}},
      {with_messages("[" + u + ", " + call + R"({"id": "a", "function": {"arguments": "{}"}}]}])"),
       {ErrorCode::kMissingField, "messages[1].tool_calls[0].function.name: missing"}},
      {with_messages("[" + u + ", " + call + R"({"id": "a", "function": {"name": ""}}]}])"),
       {ErrorCode::kInvalidValue,
        "messages[1].tool_calls[0].function.name: expected a non-empty string"}},
      {with_messages("[" + u + ", " + call + R"({"id": "a", "function": "f"}]}])"),
       {ErrorCode::kWrongType, "messages[1].tool_calls[0].function: expected an object"}},
      {with_messages("[" + u + ", " + call +
                     R"({"id": "a", "function": {"name": "f", "arguments": "{\"x\": 1"}}]}])"),
       {ErrorCode::kBadJson,
        "messages[1].tool_calls[0].function.arguments: expected a string holding a JSON object, "
        "found text that is not JSON: \"{\\\"x\\\": 1\""}},
      {with_messages("[" + u + ", " + call +
                     R"({"id": "a", "function": {"name": "f", "arguments": "[1, 2]"}}]}])"),
       {ErrorCode::kInvalidValue,
        "messages[1].tool_calls[0].function.arguments: expected a JSON object, found an array"}},
      {with_messages("[" + u + ", " + call +
                     R"({"id": "a", "function": {"name": "f", "arguments": 12}}]}])"),
       {ErrorCode::kWrongType,
        "messages[1].tool_calls[0].function.arguments: expected an object or a string holding a "
        "JSON object, found a number"}},
      {with_messages("[" + u + ", " + call + R"({"id": 4, "function": {"name": "f"}}]}])"),
       {ErrorCode::kWrongType, "messages[1].tool_calls[0].id: expected a string, found a number"}},
      {with_messages("[" + u + ", " + call + R"({"id": "", "function": {"name": "f"}}]}])"),
       {ErrorCode::kInvalidValue, "messages[1].tool_calls[0].id: expected a non-empty string"}},
      {with_messages("[" + u + ", " + call + R"({"id": "a", "name": "f", "arguments": []}]}])"),
       {ErrorCode::kWrongType,
        "messages[1].tool_calls[0].arguments: expected an object or a string"}},
      {with_messages(
           "[" + u + ", " + call +
           R"({"id": "a", "function": {"name": "f"}}]}, {"role": "tool", "tool_call_id": "a"}])"),
       {ErrorCode::kMissingField, "messages[2].content: missing"}},
      {with_messages(
           "[" + u + ", " + call +
           R"({"id": "a", "function": {"name": "f"}}]}, {"role": "tool", "tool_call_id": 1, "content": "x"}])"),
       {ErrorCode::kWrongType, "messages[2].tool_call_id: expected a string, found a number"}},
      {with_messages("[" + u + R"(, {"role": "tool", "tool": "", "content": "x"}])"),
       {ErrorCode::kInvalidValue, "messages[1].tool: expected a non-empty string"}},
      {with_messages(R"([{"role": "system", "tools": {"a": 1}}])"),
       {ErrorCode::kWrongType, "messages[0].tools: expected an array of tool declarations"}},
      {with_messages("[" + u + "]", R"("tools": {"type": "function"})"),
       {ErrorCode::kWrongType, "tools: expected an array of tool declarations, found an object"}},
      {with_messages("[" + u + "]", R"("tools": ["f"])"),
       {ErrorCode::kWrongType, "tools[0]: expected an object"}},
      {with_messages("[" + u + "]", R"("tools": [{"function": {"name": "f"}}])"),
       {ErrorCode::kMissingField, "tools[0].type: missing (expected \"function\")"}},
      {with_messages("[" + u + "]",
                     R"("tools": [{"type": "retrieval", "function": {"name": "f"}}])"),
       {ErrorCode::kInvalidValue, "tools[0].type: expected \"function\", found \"retrieval\""}},
      {with_messages("[" + u + "]", R"("tools": [{"type": "function"}])"),
       {ErrorCode::kMissingField, "tools[0].function: missing"}},
      {with_messages("[" + u + "]",
                     R"("tools": [{"type": "function", "function": {"description": "d"}}])"),
       {ErrorCode::kMissingField, "tools[0].function.name: missing"}},
      {with_messages(
           "[" + u + "]",
           R"("tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}])"),
       {ErrorCode::kWrongType,
        "tools[0].function.parameters: expected a JSON Schema object, found a string"}},
      {with_messages("[" + u + "]",
                     R"("tool_choice": {"type": "function", "function": {"name": "get_weather"}})"),
       {ErrorCode::kUnsupported,
        "tool_choice: a named tool choice ({\"type\": \"function\", \"function\": {\"name\": "
        "\"get_weather\"}}) needs constrained decoding, which this server does not implement; "
        "send \"auto\", \"required\" or \"none\""}},
      {with_messages("[" + u + "]", R"("tool_choice": "sometimes")"),
       {ErrorCode::kInvalidValue,
        "tool_choice: expected \"auto\", \"none\" or \"required\", found \"sometimes\""}},
      {with_messages("[" + u + "]", R"("tool_choice": 1)"),
       {ErrorCode::kWrongType,
        "tool_choice: expected \"auto\", \"none\" or \"required\", found a number"}},
      {with_messages("[" + u + "]", R"("response_format": "json_object")"),
       {ErrorCode::kWrongType, "response_format: expected an object"}},
      {with_messages("[" + u + "]", R"("response_format": {})"),
       {ErrorCode::kMissingField, "response_format.type: missing"}},
      {with_messages("[" + u + "]", R"("response_format": {"type": "xml"})"),
       {ErrorCode::kInvalidValue,
        "response_format.type: expected \"text\", \"json_object\" or \"json_schema\", found "
        "\"xml\""}},
      {with_messages("[" + u + "]", R"("response_format": {"type": "json_schema"})"),
       {ErrorCode::kMissingField, "response_format.json_schema: missing"}},
      {with_messages("[" + u + "]",
                     R"("response_format": {"type": "json_schema", "json_schema": 1})"),
       {ErrorCode::kWrongType, "response_format.json_schema: expected an object"}},
      {with_messages("[" + u + "]", R"("chat_template_kwargs": [])"),
       {ErrorCode::kWrongType, "chat_template_kwargs: expected an object, found an array"}},
      {with_messages("[" + u + "]", R"("chat_template_kwargs": {"thinking": "yes"})"),
       {ErrorCode::kWrongType,
        "chat_template_kwargs.thinking: expected a boolean, found a string"}},
      {with_messages("[" + u + "]", R"("chat_template_kwargs": {"thinking_effort": "medium"})"),
       {ErrorCode::kInvalidValue,
        "chat_template_kwargs.thinking_effort: unsupported value \"medium\" (the template "
        "supports low, high and max"}},
      {with_messages("[" + u + "]", R"("chat_template_kwargs": {"thinking_effort": 3})"),
       {ErrorCode::kInvalidValue, "chat_template_kwargs.thinking_effort: unsupported value 3"}},
      {with_messages("[" + u + "]", R"("reasoning_effort": "medium")"),
       {ErrorCode::kInvalidValue,
        "reasoning_effort: expected \"none\", \"low\", \"high\" or \"max\" (the Kimi-K3 "
        "template's thinking efforts), found \"medium\""}},
      {with_messages("[" + u + "]", R"("reasoning_effort": 2)"),
       {ErrorCode::kWrongType, "reasoning_effort: expected a string, found a number"}},
      {with_messages("[" + u + "]", R"("add_generation_prompt": "yes")"),
       {ErrorCode::kWrongType, "add_generation_prompt: expected a boolean, found a string"}},
  };
  ASSERT_GE(rows.size(), 50u);
  for (const auto& [body, want] : rows) {
    const Json j = Json::parse(body);
    auto r = parse_chat_request(j);
    ASSERT_FALSE(r.is_ok()) << body;
    EXPECT_EQ(r.status().code(), want.code) << body << "\n" << r.status().to_string();
    EXPECT_NE(r.status().message().find(want.message), std::string::npos)
        << body << "\n got: " << r.status().message() << "\n want: " << want.message;
  }
}

// Where the template itself raises, render_chat_request fails with the message index.
TEST(ChatRequest, UnresolvableToolResultIsNamedRenderError) {
  const Json body = Json::parse(with_messages(
      std::string("[") + kUser +
      R"(, {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "function": {"name": "f"}}]},
           {"role": "tool", "tool_call_id": "a", "content": "1"},
           {"role": "tool", "content": "2"}])"));
  auto req = parse_chat_request(body);
  ASSERT_TRUE(req.is_ok()) << req.status().to_string();
  auto seg = render_chat_request(*req);
  ASSERT_FALSE(seg.is_ok());
  EXPECT_EQ(seg.status().code(), ErrorCode::kInvalidValue);
  EXPECT_NE(seg.status().message().find("messages[3]: tool message has no tool name"),
            std::string::npos)
      << seg.status().message();
  EXPECT_NE(seg.status().message().find("it has 1 calls; this is tool result 2"), std::string::npos)
      << seg.status().message();
}

// The thinking switches: chat_template_kwargs wins over reasoning_effort; with thinking off the
// effort is not read (the template ignores it, even an unsupported one).
TEST(ChatRequest, ThinkingAndEffortPrecedence) {
  const std::string u = std::string("[") + kUser + "]";
  struct Row {
    std::string extra;
    bool thinking;
    std::optional<std::string> effort;
  };
  const std::vector<Row> rows = {
      {"", true, "max"},
      {R"("reasoning_effort": "none")", false, "max"},
      {R"("reasoning_effort": "low")", true, "low"},
      {R"("reasoning_effort": "none", "chat_template_kwargs": {"thinking": true})", true, "max"},
      {R"("reasoning_effort": "high", "chat_template_kwargs": {"thinking_effort": "low"})", true,
       "low"},
      {R"("reasoning_effort": "high", "chat_template_kwargs": {"thinking_effort": null})", true,
       std::nullopt},
      {R"("chat_template_kwargs": {"thinking": false, "thinking_effort": "medium"})", false, "max"},
      {R"("chat_template_kwargs": {"thinking": null})", true, "max"},
  };
  for (const Row& row : rows) {
    auto req = parse_chat_request(Json::parse(with_messages(u, row.extra)));
    ASSERT_TRUE(req.is_ok()) << row.extra << ": " << req.status().to_string();
    EXPECT_EQ(req->options.thinking, row.thinking) << row.extra;
    if (row.thinking) {
      EXPECT_EQ(req->options.thinking_effort, row.effort) << row.extra;
    }
  }
}

}  // namespace
}  // namespace attnres
