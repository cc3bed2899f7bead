// Kimi-K3 XTML chat rendering; see chat.h for the format and contract.
#include "tokenizer/chat.h"

#include "tokenizer/utf8.h"

namespace attnres {
namespace {

using Attrs = std::vector<std::pair<std::string, std::string>>;

void text(std::vector<ChatSegment>& out, std::string s) {
  if (!s.empty()) out.push_back({std::move(s), false});
}
void control(std::vector<ChatSegment>& out, std::string_view s) {
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

void open_tag(std::vector<ChatSegment>& out, std::string_view tag, const Attrs& attrs = {}) {
  control(out, kOpenToken);
  text(out, std::string(tag));
  for (const auto& [k, v] : attrs) text(out, " " + k + "=\"" + escape_attr(v) + "\"");
  control(out, kSepToken);
}

void close_tag(std::vector<ChatSegment>& out, std::string_view tag) {
  control(out, kCloseToken);
  text(out, std::string(tag));
  control(out, kSepToken);
}

// Python's `not s.strip()`.
bool is_blank(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Step st = utf8_step(s, i);
    if (!st.ok || !python_isspace(st.codepoint)) return false;
    i += st.length;
  }
  return true;
}

std::string xtml_type(const nlohmann::ordered_json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  return "array";
}

void render_assistant(std::vector<ChatSegment>& out, const ChatMessage& m, bool thinking) {
  if (thinking) {
    open_tag(out, "think");
    if (!is_blank(m.reasoning)) text(out, m.reasoning);
    close_tag(out, "think");
  }
  open_tag(out, "response");
  text(out, m.content);
  close_tag(out, "response");
  if (m.tool_calls.empty()) return;
  open_tag(out, "tools");
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    const ChatToolCall& call = m.tool_calls[i];
    open_tag(out, "call", {{"tool", call.name}, {"index", std::to_string(i + 1)}});
    for (const auto& [key, value] : call.arguments.items()) {
      open_tag(out, "argument", {{"key", key}, {"type", xtml_type(value)}});
      text(out, value.is_string() ? value.get<std::string>() : python_json_dumps(value));
      close_tag(out, "argument");
    }
    close_tag(out, "call");
  }
  close_tag(out, "tools");
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& v) {
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + python_json_dumps(v[i]);
    return s + "]";
  }
  if (v.is_object()) {
    std::string s = "{";
    bool first = true;
    for (const auto& [k, x] : v.items()) {
      s += (first ? "" : ", ") + python_json_dumps(k) + ": " + python_json_dumps(x);
      first = false;
    }
    return s + "}";
  }
  return v.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::ordered_json::error_handler_t::replace);
}

namespace {

// A message in rendering order, with the tool name its call assigns (encoding_k3.py,
// normalize_xtml_tool_result_messages).
struct Ordered {
  const ChatMessage* message;
  size_t index;               // position in the caller's list, for errors
  std::string tool_override;  // non-empty: the name of the call this tool message answers
};

std::vector<Ordered> order_tool_results(std::span<const ChatMessage> messages) {
  std::vector<Ordered> out;
  std::vector<std::pair<std::string, size_t>> call_index;  // call id -> 1-based position
  const std::vector<ChatToolCall>* calls = nullptr;
  for (size_t i = 0; i < messages.size();) {
    const ChatMessage& m = messages[i];
    if (m.role != ChatRole::kTool) {
      if (m.role == ChatRole::kAssistant) {
        calls = &m.tool_calls;
        call_index.clear();
        for (size_t c = 0; c < m.tool_calls.size(); ++c) {
          const std::string& id = m.tool_calls[c].id;
          if (id.empty()) continue;
          bool seen = false;
          for (const auto& e : call_index) seen = seen || e.first == id;
          if (!seen) call_index.push_back({id, c + 1});  // the first call with an id wins
        }
      }
      out.push_back({&m, i, ""});
      ++i;
      continue;
    }
    // A run of tool messages: put in call order only if every one resolves to a call.
    std::vector<std::pair<size_t, Ordered>> run;
    bool unresolved = false;
    for (; i < messages.size() && messages[i].role == ChatRole::kTool; ++i) {
      size_t position = 0;
      for (const auto& e : call_index)
        if (!messages[i].tool_call_id.empty() && e.first == messages[i].tool_call_id)
          position = e.second;
      if (position == 0) unresolved = true;
      const std::string name = position > 0 ? (*calls)[position - 1].name : "";
      run.push_back({position, {&messages[i], i, name}});
    }
    if (!unresolved)
      std::stable_sort(run.begin(), run.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    // Unresolved runs keep their order, but resolved members still take their calls' names.
    for (auto& entry : run) out.push_back(std::move(entry.second));
  }
  return out;
}

}  // namespace

Result<std::vector<ChatSegment>> render_chat(std::span<const ChatMessage> messages,
                                             const ChatOptions& options) {
  std::vector<ChatSegment> out;
  const std::vector<ChatToolCall>* prior_calls = nullptr;
  size_t tool_index = 0;
  for (const Ordered& o : order_tool_results(messages)) {
    const ChatMessage& m = *o.message;
    const size_t mi = o.index;
    switch (m.role) {
      case ChatRole::kSystem:
      case ChatRole::kUser: {
        Attrs attrs = {{"role", m.role == ChatRole::kSystem ? "system" : "user"}};
        if (!m.name.empty()) attrs.push_back({"name", m.name});
        open_tag(out, "message", attrs);
        text(out, m.content);
        break;
      }
      case ChatRole::kAssistant:
        prior_calls = &m.tool_calls;
        tool_index = 0;
        open_tag(out, "message", {{"role", "assistant"}});
        render_assistant(out, m, options.thinking);
        break;
      case ChatRole::kTool: {
        ++tool_index;
        std::string name = o.tool_override.empty() ? m.tool : o.tool_override;
        if (name.empty() && prior_calls && tool_index <= prior_calls->size())
          name = (*prior_calls)[tool_index - 1].name;
        if (name.empty())
          return Status(ErrorCode::kInvalidArgument,
                        "chat message " + std::to_string(mi) +
                            ": tool message has no tool name and no matching preceding call");
        open_tag(out, "message",
                 {{"role", "tool"}, {"tool", name}, {"index", std::to_string(tool_index)}});
        text(out, m.content);
        break;
      }
    }
    close_tag(out, "message");
    control(out, kEndOfMsgToken);
  }
  if (options.add_generation_prompt) {
    open_tag(out, "message", {{"role", "assistant"}});
    open_tag(out, options.thinking ? "think" : "response");
  }
  return out;
}

Result<std::vector<TokenId>> encode_chat(const Tokenizer& tokenizer,
                                         std::span<const ChatMessage> messages,
                                         const ChatOptions& options) {
  for (std::string_view name : {kOpenToken, kCloseToken, kSepToken, kEndOfMsgToken}) {
    if (tokenizer.special_id(name) < 0)
      return Status(ErrorCode::kMissingField,
                    tokenizer.source() + ": the chat format needs control token " +
                        std::string(name) + ", which " + tokenizer.control_token_source() +
                        " does not define");
  }
  ATTNRES_ASSIGN_OR_RETURN(std::vector<ChatSegment> segments, render_chat(messages, options));
  std::vector<TokenId> ids;
  for (const ChatSegment& s : segments)
    ATTNRES_RETURN_IF_ERROR(tokenizer.encode_into(s.text, s.control, ids));
  return ids;
}

Result<std::vector<ChatMessage>> chat_messages_from_json(const nlohmann::ordered_json& j) {
  if (!j.is_array())
    return Status(ErrorCode::kWrongType, "chat messages: expected a JSON array of messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& m = j[i];
    const std::string where = "chat message " + std::to_string(i);
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return Status(ErrorCode::kMissingField, where + ": expected an object with a \"role\"");
    auto str = [&](const char* key, std::string& dst) -> Status {
      if (!m.contains(key) || m[key].is_null()) return Status::ok();
      if (!m[key].is_string())
        return Status(ErrorCode::kWrongType, where + ": \"" + key + "\" must be a string");
      dst = m[key].get<std::string>();
      return Status::ok();
    };
    ChatMessage msg;
    const std::string role = m["role"];
    if (role == "system") {
      msg.role = ChatRole::kSystem;
    } else if (role == "user") {
      msg.role = ChatRole::kUser;
    } else if (role == "assistant") {
      msg.role = ChatRole::kAssistant;
    } else if (role == "tool") {
      msg.role = ChatRole::kTool;
    } else {
      return Status(ErrorCode::kInvalidValue, where + ": unknown role \"" + role +
                                                  "\" (expected system, user, assistant, tool)");
    }
    ATTNRES_RETURN_IF_ERROR(str("content", msg.content));
    // `reasoning_content or reasoning` (encoding_k3.py): an empty reasoning_content falls back.
    std::string reasoning_content;
    ATTNRES_RETURN_IF_ERROR(str("reasoning", msg.reasoning));
    ATTNRES_RETURN_IF_ERROR(str("reasoning_content", reasoning_content));
    if (!reasoning_content.empty()) msg.reasoning = std::move(reasoning_content);
    // A tool message's "name" is its tool; "tool" takes precedence (encoding_k3.py).
    ATTNRES_RETURN_IF_ERROR(str("name", msg.role == ChatRole::kTool ? msg.tool : msg.name));
    ATTNRES_RETURN_IF_ERROR(str("tool", msg.tool));
    if (msg.role == ChatRole::kTool) {
      ATTNRES_RETURN_IF_ERROR(str("id", msg.tool_call_id));
      ATTNRES_RETURN_IF_ERROR(str("tool_call_id", msg.tool_call_id));
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      if (!m["tool_calls"].is_array())
        return Status(ErrorCode::kWrongType, where + ": \"tool_calls\" must be an array");
      for (size_t c = 0; c < m["tool_calls"].size(); ++c) {
        const auto& call = m["tool_calls"][c];
        const auto& fn = call.contains("function") ? call["function"] : call;
        const std::string cw = where + " tool_calls[" + std::to_string(c) + "]";
        if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string())
          return Status(ErrorCode::kMissingField, cw + ": missing function \"name\"");
        ChatToolCall tc;
        tc.name = fn["name"];
        if (call.contains("id") && !call["id"].is_null()) {
          const auto& id = call["id"];
          tc.id = id.is_string() ? id.get<std::string>() : id.dump();
        }
        if (fn.contains("arguments") && !fn["arguments"].is_null()) {
          nlohmann::ordered_json args = fn["arguments"];
          if (args.is_string()) {
            const std::string s = args.get<std::string>();
            args = s.find_first_not_of(" \t\r\n") == std::string::npos
                       ? nlohmann::ordered_json::object()
                       : nlohmann::ordered_json::parse(s, nullptr, false);
          }
          if (!args.is_object())
            return Status(ErrorCode::kWrongType, cw + ": arguments must be a JSON object");
          tc.arguments = std::move(args);
        }
        msg.tool_calls.push_back(std::move(tc));
      }
    }
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace attnres
