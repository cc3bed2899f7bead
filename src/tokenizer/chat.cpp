// Kimi-K3 XTML chat rendering; see chat.h for the format and contract. Each function below
// mirrors the template macro of the same name (tests/fixtures/kimi-k3/chat_template.jinja).
#include "tokenizer/chat.h"

#include <algorithm>

namespace attnres {
namespace {

using Json = nlohmann::ordered_json;
using Attrs = std::vector<std::pair<std::string, std::string>>;
using Segments = std::vector<ChatSegment>;

void text(Segments& out, std::string s) {
  if (!s.empty()) out.push_back({std::move(s), false});
}
void control(Segments& out, std::string_view s) {
  out.push_back({std::string(s), true});
}

std::string escape_attr(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '"') {
      out += "&quot;";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

void open_tag(Segments& out, std::string_view tag, const Attrs& attrs = {}) {
  control(out, kOpenToken);
  text(out, std::string(tag));
  for (const auto& [k, v] : attrs) text(out, " " + k + "=\"" + escape_attr(v) + "\"");
  control(out, kSepToken);
}

void close_tag(Segments& out, std::string_view tag) {
  control(out, kCloseToken);
  text(out, std::string(tag));
  control(out, kSepToken);
}

void end_message(Segments& out) {
  close_tag(out, "message");
  control(out, kEndOfMsgToken);
}

void internal_system_message(Segments& out, std::string_view type, std::string_view body) {
  open_tag(out, "message", {{"role", "system"}, {"type", std::string(type)}});
  text(out, std::string(python_strip(body)));
  end_message(out);
}

void render_tool_declare(Segments& out, const Json& tools, bool dynamic) {
  open_tag(out, "message", {{"role", "system"}, {"type", "tool-declare"}});
  std::string body = dynamic ? "## New Tools Available\nThe system dynamically extends the toolset "
                               "via lazy-loading.\nYou have access to all existing and extended "
                               "tools.\nHere are the specs for the extended tools.\n\n```json\n"
                             : "# Tools\nHere are the available tools, described in "
                               "JSONSchema.\n\n```json\n";
  body += json_sorted(tools);
  body += "\n```";
  text(out, std::move(body));
  end_message(out);
}

void render_content(Segments& out, const ChatMessage& m) {
  if (m.content_parts.empty()) {
    text(out, m.content);
    return;
  }
  for (const std::string& part : m.content_parts) text(out, part);
}

std::string xtml_type(const Json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  return "array";
}

void render_assistant(Segments& out, const ChatMessage& m, bool thinking) {
  if (thinking) {
    open_tag(out, "think");
    if (!python_is_blank(m.reasoning)) text(out, m.reasoning);
    close_tag(out, "think");
  }
  open_tag(out, "response");
  render_content(out, m);
  close_tag(out, "response");
  if (m.tool_calls.empty()) return;
  open_tag(out, "tools");
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    const ChatToolCall& call = m.tool_calls[i];
    open_tag(out, "call", {{"tool", call.name}, {"index", std::to_string(i + 1)}});
    if (call.json_block) {
      open_tag(out, "json", {{"type", "object"}});
      text(out, *call.json_block);
      close_tag(out, "json");
    } else if (call.arguments.is_object()) {
      for (const auto& [key, value] : call.arguments.items()) {
        open_tag(out, "argument", {{"key", key}, {"type", xtml_type(value)}});
        text(out, value.is_string() ? value.get<std::string>() : python_json_dumps(value));
        close_tag(out, "argument");
      }
    } else if (call.arguments.is_string() &&
               !python_is_blank(call.arguments.get_ref<const std::string&>())) {
      open_tag(out, "json", {{"type", "object"}});
      text(out, call.arguments.get<std::string>());
      close_tag(out, "json");
    }
    close_tag(out, "call");
  }
  close_tag(out, "tools");
}

// The template's `state`: the latest assistant message's calls and the tool-result counter.
struct ToolState {
  const std::vector<ChatToolCall>* calls = nullptr;
  size_t tool_index = 0;
};

Status render_tool_message(Segments& out, const ChatMessage& m, size_t mi, ToolState& state,
                           const std::string* resolved_name) {
  ++state.tool_index;
  std::string name = resolved_name ? *resolved_name : m.tool;
  if (name.empty() && state.calls && state.tool_index <= state.calls->size())
    name = (*state.calls)[state.tool_index - 1].name;
  if (name.empty())
    return Status(ErrorCode::kInvalidValue,
                  "messages[" + std::to_string(mi) +
                      "]: tool message has no tool name: give \"name\", a \"tool_call_id\" "
                      "matching a call of the preceding assistant message, or answer that "
                      "message's calls in order (it has " +
                      std::to_string(state.calls ? state.calls->size() : 0) +
                      " calls; this is tool result " + std::to_string(state.tool_index) + ")");
  open_tag(out, "message",
           {{"role", "tool"}, {"tool", name}, {"index", std::to_string(state.tool_index)}});
  render_content(out, m);
  end_message(out);
  return Status::ok();
}

// A run of consecutive tool messages [first, last): in call order, named by the calls, when
// every one carries an id matching a call; otherwise in order.
Status render_tool_run(Segments& out, std::span<const ChatMessage> messages, size_t first,
                       size_t last, ToolState& state) {
  const auto matches = [&](const ChatMessage& m) {
    if (m.tool_call_id.empty() || !state.calls) return false;
    return std::any_of(state.calls->begin(), state.calls->end(),
                       [&](const ChatToolCall& c) { return c.id == m.tool_call_id; });
  };
  bool resolved = true;
  for (size_t i = first; i < last; ++i) resolved = resolved && matches(messages[i]);
  if (!resolved) {
    for (size_t i = first; i < last; ++i)
      ATTNRES_RETURN_IF_ERROR(render_tool_message(out, messages[i], i, state, nullptr));
    return Status::ok();
  }
  std::vector<std::string> emitted;
  // The calls are read through a copy of the pointer: rendering does not change them.
  const std::vector<ChatToolCall>& calls = *state.calls;
  for (const ChatToolCall& call : calls) {
    if (call.id.empty() || std::find(emitted.begin(), emitted.end(), call.id) != emitted.end())
      continue;
    emitted.push_back(call.id);
    for (size_t i = first; i < last; ++i)
      if (messages[i].tool_call_id == call.id)
        ATTNRES_RETURN_IF_ERROR(render_tool_message(out, messages[i], i, state, &call.name));
  }
  return Status::ok();
}

const char* effort_list() {
  return "low, high, max";
}
bool known_effort(std::string_view e) {
  return e == "low" || e == "high" || e == "max";
}

}  // namespace

Result<std::vector<ChatSegment>> render_chat_template(std::span<const ChatMessage> messages,
                                                      const ChatTemplateOptions& o) {
  Segments out;
  if (o.thinking && o.thinking_effort && !known_effort(*o.thinking_effort))
    return Status(ErrorCode::kInvalidValue, "thinking_effort: unsupported value \"" +
                                                *o.thinking_effort +
                                                "\" (supported: " + effort_list() + ")");
  if (o.tools.is_array() && !o.tools.empty()) render_tool_declare(out, o.tools, false);
  if (o.thinking && o.thinking_effort)
    internal_system_message(
        out, "thinking-effort",
        "`thinking_effort` guides on how much to think in your thinking channel (not including "
        "the response channel), supported values include `low`, `medium`, `high`, and "
        "`max`.\nNow the system is invoked with `thinking_effort=" +
            *o.thinking_effort + "`.");
  ToolState state;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    switch (m.role) {
      case ChatRole::kSystem:
        if (m.tools.is_array() && !m.tools.empty()) {
          render_tool_declare(out, m.tools, true);
          break;
        }
        [[fallthrough]];
      case ChatRole::kUser: {
        Attrs attrs = {{"role", m.role == ChatRole::kSystem ? "system" : "user"}};
        if (!m.name.empty()) attrs.push_back({"name", m.name});
        open_tag(out, "message", attrs);
        render_content(out, m);
        end_message(out);
        break;
      }
      case ChatRole::kAssistant: {
        state.calls = &m.tool_calls;
        state.tool_index = 0;
        Attrs attrs = {{"role", "assistant"}};
        if (!m.name.empty()) attrs.push_back({"name", m.name});
        open_tag(out, "message", attrs);
        render_assistant(out, m, o.thinking);
        end_message(out);
        break;
      }
      case ChatRole::kTool: {
        if (i > 0 && messages[i - 1].role == ChatRole::kTool) break;  // rendered with its run
        size_t last = i;
        while (last < messages.size() && messages[last].role == ChatRole::kTool) ++last;
        ATTNRES_RETURN_IF_ERROR(render_tool_run(out, messages, i, last, state));
        break;
      }
    }
  }
  if (o.tool_choice == ChatToolChoice::kRequired)
    internal_system_message(out, "tool-choice",
                            "The system is invoked with `tool_choice=required`.\nYou MUST call "
                            "tools in the next message.");
  else if (o.tool_choice == ChatToolChoice::kNone)
    internal_system_message(out, "tool-choice",
                            "The system is invoked with `tool_choice=none`.\nYou MUST NOT call "
                            "any tools in the next message.");
  static constexpr std::string_view kRawJson =
      "\nYour response must be raw JSON data without markdown code blocks (```json) or any "
      "additional formatting.";
  if (o.response_format == ChatResponseFormat::kJsonObject) {
    internal_system_message(
        out, "response-format",
        "The system is invoked with `response_format=json_object`." + std::string(kRawJson));
  } else if (o.response_format == ChatResponseFormat::kJsonSchema) {
    internal_system_message(out, "response-format",
                            "The system is invoked with `response_format=json_schema`." +
                                std::string(kRawJson) +
                                "\nThe JSON data must match the following schema:\n```json\n" +
                                json_sorted(o.response_schema) + "\n```");
  }
  if (o.add_generation_prompt) {
    open_tag(out, "message", {{"role", "assistant"}});
    open_tag(out, o.thinking ? "think" : "response");
  }
  return out;
}

std::string chat_segments_text(std::span<const ChatSegment> segments) {
  size_t n = 0;
  for (const ChatSegment& s : segments) n += s.text.size();
  std::string out;
  out.reserve(n);
  for (const ChatSegment& s : segments) out += s.text;
  return out;
}

Result<std::vector<TokenId>> encode_chat_segments(const Tokenizer& tokenizer,
                                                  std::span<const ChatSegment> segments) {
  for (std::string_view name : {kOpenToken, kCloseToken, kSepToken, kEndOfMsgToken}) {
    if (tokenizer.special_id(name) < 0)
      return Status(ErrorCode::kMissingField,
                    tokenizer.source() + ": the chat format needs control token " +
                        std::string(name) + ", which " + tokenizer.control_token_source() +
                        " does not define");
  }
  std::vector<TokenId> ids;
  for (const ChatSegment& s : segments)
    ATTNRES_RETURN_IF_ERROR(tokenizer.encode_into(s.text, s.control, ids));
  return ids;
}

Result<std::vector<ChatSegment>> render_chat(std::span<const ChatMessage> messages,
                                             const ChatOptions& options) {
  ChatTemplateOptions o;
  o.thinking = options.thinking;
  o.thinking_effort.reset();
  o.add_generation_prompt = options.add_generation_prompt;
  return render_chat_template(messages, o);
}

Result<std::vector<TokenId>> encode_chat(const Tokenizer& tokenizer,
                                         std::span<const ChatMessage> messages,
                                         const ChatOptions& options) {
  ATTNRES_ASSIGN_OR_RETURN(std::vector<ChatSegment> segments, render_chat(messages, options));
  return encode_chat_segments(tokenizer, segments);
}

Result<std::vector<ChatMessage>> chat_messages_from_json(const nlohmann::ordered_json& messages) {
  return parse_chat_messages(messages, {});
}

}  // namespace attnres
