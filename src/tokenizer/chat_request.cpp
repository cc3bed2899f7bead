// OpenAI chat-completions request fields read into ChatRequest; see chat.h for the contract.
// Where the template reads a field with Python semantics (`message.get('tool_call_id',
// message.get('id'))`, `'tool' in message`, `reasoning_content or reasoning`), the same
// decision is taken here, so that the renderer works on plain values.
#include <algorithm>

#include "tokenizer/chat.h"

namespace attnres {
namespace {

using Json = nlohmann::ordered_json;

std::string type_name(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      return "a number";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::array:
      return "an array";
    case Json::value_t::object:
      return "an object";
    default:
      return "a non-JSON value";
  }
}

// A value quoted for a message, shortened when long.
std::string quoted(const Json& v) {
  std::string s = python_json_dumps(v);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

Status wrong_type(const std::string& path, std::string_view expected, const Json& found) {
  return Status(ErrorCode::kWrongType,
                path + ": expected " + std::string(expected) + ", found " + type_name(found));
}

Status missing(const std::string& path, std::string_view expected) {
  return Status(ErrorCode::kMissingField,
                path + ": missing (expected " + std::string(expected) + ")");
}

bool present(const Json& obj, const char* key) {
  return obj.contains(key) && !obj.at(key).is_null();
}

// An optional string field: absent or null leaves `dst` unchanged.
Status read_string(const Json& obj, const char* key, const std::string& where, std::string& dst,
                   bool non_empty = false) {
  if (!present(obj, key)) return Status::ok();
  const Json& v = obj.at(key);
  const std::string path = where + "." + key;
  if (!v.is_string()) return wrong_type(path, "a string", v);
  if (non_empty && v.get_ref<const std::string&>().empty())
    return Status(ErrorCode::kInvalidValue, path + ": expected a non-empty string, found \"\"");
  dst = v.get<std::string>();
  return Status::ok();
}

Status read_bool(const Json& obj, const char* key, const std::string& where, bool& dst) {
  if (!present(obj, key)) return Status::ok();
  const Json& v = obj.at(key);
  if (!v.is_boolean()) return wrong_type(where + key, "a boolean", v);
  dst = v.get<bool>();
  return Status::ok();
}

Status parse_content(const Json& m, const std::string& where, bool required, ChatMessage& msg) {
  const std::string path = where + ".content";
  if (!present(m, "content")) {
    if (required) return missing(path, "a string or an array of text parts");
    return Status::ok();
  }
  const Json& c = m.at("content");
  if (c.is_string()) {
    msg.content = c.get<std::string>();
    return Status::ok();
  }
  if (!c.is_array()) return wrong_type(path, "a string or an array of text parts", c);
  for (size_t k = 0; k < c.size(); ++k) {
    const Json& part = c[k];
    const std::string pp = path + "[" + std::to_string(k) + "]";
    if (!part.is_object())
      return wrong_type(pp, "an object {\"type\": \"text\", \"text\": ...}", part);
    if (!present(part, "type")) return missing(pp + ".type", "\"text\"");
    const Json& type = part.at("type");
    if (!type.is_string()) return wrong_type(pp + ".type", "a string", type);
    if (type.get_ref<const std::string&>() != "text")
      return Status(ErrorCode::kUnsupported,
                    pp + ".type: content parts of type " + quoted(type) +
                        " are not supported (this engine reads text only; expected \"text\")");
    if (!present(part, "text")) return missing(pp + ".text", "a string");
    if (!part.at("text").is_string()) return wrong_type(pp + ".text", "a string", part.at("text"));
    msg.content_parts.push_back(part.at("text").get<std::string>());
  }
  return Status::ok();
}

// Tool declarations: [{"type": "function", "function": {"name": ..., ...}}, ...]. Everything
// beyond the name is rendered as given.
Status check_tools(const Json& tools, const std::string& path) {
  if (!tools.is_array()) return wrong_type(path, "an array of tool declarations", tools);
  for (size_t k = 0; k < tools.size(); ++k) {
    const Json& t = tools[k];
    const std::string tp = path + "[" + std::to_string(k) + "]";
    if (!t.is_object())
      return wrong_type(tp, "an object {\"type\": \"function\", \"function\": {...}}", t);
    if (!present(t, "type")) return missing(tp + ".type", "\"function\"");
    if (t.at("type") != "function")
      return Status(ErrorCode::kInvalidValue,
                    tp + ".type: expected \"function\", found " + quoted(t.at("type")));
    if (!present(t, "function")) return missing(tp + ".function", "an object with a \"name\"");
    const Json& fn = t.at("function");
    if (!fn.is_object()) return wrong_type(tp + ".function", "an object", fn);
    std::string name;
    ATTNRES_RETURN_IF_ERROR(read_string(fn, "name", tp + ".function", name, true));
    if (name.empty()) return missing(tp + ".function.name", "a string");
    if (present(fn, "parameters") && !fn.at("parameters").is_object())
      return wrong_type(tp + ".function.parameters", "a JSON Schema object", fn.at("parameters"));
  }
  return Status::ok();
}

Status parse_tool_call(const Json& call, const std::string& cp, const ChatRequestOptions& options,
                       ChatToolCall& tc) {
  if (!call.is_object())
    return wrong_type(cp, "an object {\"id\", \"type\": \"function\", \"function\": {...}}", call);
  // `tool_call.function if it is a mapping else tool_call` (the flat form {"name", "arguments"}).
  const bool nested = present(call, "function");
  if (nested && !call.at("function").is_object())
    return wrong_type(cp + ".function", "an object {\"name\", \"arguments\"}", call.at("function"));
  const Json& fn = nested ? call.at("function") : call;
  const std::string fp = nested ? cp + ".function" : cp;
  ATTNRES_RETURN_IF_ERROR(read_string(fn, "name", fp, tc.name, true));
  if (tc.name.empty()) return missing(fp + ".name", "the function name");
  ATTNRES_RETURN_IF_ERROR(read_string(call, "id", cp, tc.id, true));
  std::string block;
  if (present(fn, "_xtml_json_block")) {
    ATTNRES_RETURN_IF_ERROR(read_string(fn, "_xtml_json_block", fp, block));
    tc.json_block = std::move(block);
  }
  if (!fn.contains("arguments")) return Status::ok();  // fn.get('arguments', {})
  const Json& args = fn.at("arguments");
  const std::string ap = fp + ".arguments";
  if (args.is_null() || args.is_object()) {
    tc.arguments = args;
    return Status::ok();
  }
  if (!args.is_string()) return wrong_type(ap, "an object or a string holding a JSON object", args);
  const std::string& s = args.get_ref<const std::string&>();
  if (python_is_blank(s)) {
    tc.arguments = options.parse_string_arguments ? Json::object() : args;
    return Status::ok();
  }
  Json parsed = Json::parse(s, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded())
    return Status(ErrorCode::kBadJson, ap +
                                           ": expected a string holding a JSON object, found "
                                           "text that is not JSON: " +
                                           quoted(args));
  if (!parsed.is_object())
    return Status(ErrorCode::kInvalidValue, ap + ": expected a JSON object, found " +
                                                type_name(parsed) + " " + quoted(parsed));
  tc.arguments = options.parse_string_arguments ? std::move(parsed) : args;
  return Status::ok();
}

Status parse_message(const Json& m, size_t i, const ChatRequestOptions& options, ChatMessage& msg) {
  const std::string where = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) return wrong_type(where, "a message object", m);
  if (!present(m, "role")) return missing(where + ".role", "system, user, assistant or tool");
  const Json& role = m.at("role");
  if (!role.is_string()) return wrong_type(where + ".role", "a string", role);
  const std::string& r = role.get_ref<const std::string&>();
  if (r == "system") {
    msg.role = ChatRole::kSystem;
  } else if (r == "user") {
    msg.role = ChatRole::kUser;
  } else if (r == "assistant") {
    msg.role = ChatRole::kAssistant;
  } else if (r == "tool") {
    msg.role = ChatRole::kTool;
  } else {
    return Status(ErrorCode::kInvalidValue, where + ".role: unknown role " + quoted(role) +
                                                " (expected system, user, assistant or tool)");
  }
  switch (msg.role) {
    case ChatRole::kSystem:
      if (present(m, "tools")) {
        ATTNRES_RETURN_IF_ERROR(check_tools(m.at("tools"), where + ".tools"));
        msg.tools = m.at("tools");
      }
      ATTNRES_RETURN_IF_ERROR(read_string(m, "name", where, msg.name));
      // A system message that declares tools renders them instead of its content.
      return parse_content(m, where, msg.tools.empty(), msg);
    case ChatRole::kUser:
      ATTNRES_RETURN_IF_ERROR(read_string(m, "name", where, msg.name));
      return parse_content(m, where, true, msg);
    case ChatRole::kAssistant: {
      ATTNRES_RETURN_IF_ERROR(read_string(m, "name", where, msg.name));
      // `reasoning_content or reasoning`: an empty reasoning_content falls back.
      std::string reasoning_content;
      ATTNRES_RETURN_IF_ERROR(read_string(m, "reasoning", where, msg.reasoning));
      ATTNRES_RETURN_IF_ERROR(read_string(m, "reasoning_content", where, reasoning_content));
      if (!reasoning_content.empty()) msg.reasoning = std::move(reasoning_content);
      if (present(m, "tool_calls")) {
        const Json& calls = m.at("tool_calls");
        if (!calls.is_array())
          return wrong_type(where + ".tool_calls", "an array of tool calls", calls);
        for (size_t c = 0; c < calls.size(); ++c) {
          ChatToolCall tc;
          ATTNRES_RETURN_IF_ERROR(parse_tool_call(
              calls[c], where + ".tool_calls[" + std::to_string(c) + "]", options, tc));
          msg.tool_calls.push_back(std::move(tc));
        }
      }
      // The content may be null or absent (a turn that only called tools or only thought).
      return parse_content(m, where, false, msg);
    }
    case ChatRole::kTool:
      // `message.get('tool')` when the message has a "tool" key (even null), else "name".
      ATTNRES_RETURN_IF_ERROR(m.contains("tool") ? read_string(m, "tool", where, msg.tool, true)
                                                 : read_string(m, "name", where, msg.tool, true));
      // `message.get('tool_call_id', message.get('id'))`.
      ATTNRES_RETURN_IF_ERROR(m.contains("tool_call_id")
                                  ? read_string(m, "tool_call_id", where, msg.tool_call_id, true)
                                  : read_string(m, "id", where, msg.tool_call_id, true));
      return parse_content(m, where, true, msg);
  }
  return Status::ok();
}

Status parse_tool_choice(const Json& v, ChatToolChoice& dst) {
  if (v.is_object()) {
    return Status(ErrorCode::kUnsupported,
                  "tool_choice: a named tool choice (" + quoted(v) +
                      ") needs constrained decoding, which this server does not implement; "
                      "send \"auto\", \"required\" or \"none\"");
  }
  if (!v.is_string()) return wrong_type("tool_choice", "\"auto\", \"none\" or \"required\"", v);
  const std::string& s = v.get_ref<const std::string&>();
  if (s == "auto") {
    dst = ChatToolChoice::kAuto;
  } else if (s == "none") {
    dst = ChatToolChoice::kNone;
  } else if (s == "required") {
    dst = ChatToolChoice::kRequired;
  } else {
    return Status(ErrorCode::kInvalidValue,
                  "tool_choice: expected \"auto\", \"none\" or \"required\", found " + quoted(v));
  }
  return Status::ok();
}

Status parse_response_format(const Json& v, ChatTemplateOptions& o) {
  if (!v.is_object()) return wrong_type("response_format", "an object {\"type\": ...}", v);
  if (!present(v, "type"))
    return missing("response_format.type",
                   "\"text\", \"json_object\" or "
                   "\"json_schema\"");
  const Json& type = v.at("type");
  if (type == "text") {
    o.response_format = ChatResponseFormat::kText;
  } else if (type == "json_object") {
    o.response_format = ChatResponseFormat::kJsonObject;
  } else if (type == "json_schema") {
    o.response_format = ChatResponseFormat::kJsonSchema;
    if (!present(v, "json_schema"))
      return missing("response_format.json_schema", "an object {\"name\", \"schema\"}");
    const Json& wrapper = v.at("json_schema");
    if (!wrapper.is_object())
      return wrong_type("response_format.json_schema", "an object {\"name\", \"schema\"}", wrapper);
    // The template's schema lookup: json_schema.schema, else json_schema.json_schema, else the
    // json_schema object itself.
    if (wrapper.contains("schema")) {
      o.response_schema = wrapper.at("schema");
    } else if (wrapper.contains("json_schema")) {
      o.response_schema = wrapper.at("json_schema");
    } else {
      o.response_schema = wrapper;
    }
  } else {
    return Status(ErrorCode::kInvalidValue,
                  "response_format.type: expected \"text\", \"json_object\" or \"json_schema\", "
                  "found " +
                      quoted(type));
  }
  return Status::ok();
}

bool known_effort(const Json& v) {
  return v == "low" || v == "high" || v == "max";
}

// chat_template_kwargs {thinking, thinking_effort} and reasoning_effort.
Status parse_thinking(const Json& body, ChatTemplateOptions& o) {
  bool thinking_given = false;
  bool effort_given = false;
  Json effort;
  if (present(body, "chat_template_kwargs")) {
    const Json& kw = body.at("chat_template_kwargs");
    if (!kw.is_object()) return wrong_type("chat_template_kwargs", "an object", kw);
    if (present(kw, "thinking")) {
      ATTNRES_RETURN_IF_ERROR(read_bool(kw, "thinking", "chat_template_kwargs.", o.thinking));
      thinking_given = true;
    }
    if (kw.contains("thinking_effort")) {
      effort_given = true;
      effort = kw.at("thinking_effort");
    }
  }
  if (present(body, "reasoning_effort")) {
    const Json& re = body.at("reasoning_effort");
    if (!re.is_string()) return wrong_type("reasoning_effort", "a string", re);
    if (re == "none") {
      if (!thinking_given) o.thinking = false;
    } else if (known_effort(re)) {
      if (!effort_given) {
        effort = re;
        effort_given = true;
      }
    } else {
      return Status(ErrorCode::kInvalidValue,
                    "reasoning_effort: expected \"none\", \"low\", \"high\" or \"max\" (the "
                    "Kimi-K3 template's thinking efforts), found " +
                        quoted(re));
    }
  }
  if (!effort_given || !o.thinking) return Status::ok();  // the template reads it only if thinking
  if (effort.is_null()) {
    o.thinking_effort.reset();
    return Status::ok();
  }
  const char* path = body.contains("chat_template_kwargs") &&
                             body.at("chat_template_kwargs").is_object() &&
                             body.at("chat_template_kwargs").contains("thinking_effort")
                         ? "chat_template_kwargs.thinking_effort"
                         : "reasoning_effort";
  if (!known_effort(effort))
    return Status(ErrorCode::kInvalidValue,
                  std::string(path) + ": unsupported value " + quoted(effort) +
                      " (the template supports low, high and max, or null for no effort "
                      "message)");
  o.thinking_effort = effort.get<std::string>();
  return Status::ok();
}

}  // namespace

Result<std::vector<ChatMessage>> parse_chat_messages(const Json& messages,
                                                     const ChatRequestOptions& options) {
  if (!messages.is_array()) return wrong_type("messages", "an array of messages", messages);
  std::vector<ChatMessage> out(messages.size());
  for (size_t i = 0; i < messages.size(); ++i)
    ATTNRES_RETURN_IF_ERROR(parse_message(messages[i], i, options, out[i]));
  return out;
}

Result<ChatRequest> parse_chat_request(const Json& body, const ChatRequestOptions& options) {
  if (!body.is_object()) return wrong_type("request body", "a JSON object", body);
  ChatRequest req;
  if (!present(body, "messages")) return missing("messages", "a non-empty array of messages");
  ATTNRES_ASSIGN_OR_RETURN(req.messages, parse_chat_messages(body.at("messages"), options));
  if (req.messages.empty())
    return Status(ErrorCode::kInvalidValue,
                  "messages: expected a non-empty array of messages, found []");
  ChatTemplateOptions& o = req.options;
  if (present(body, "tools")) {
    ATTNRES_RETURN_IF_ERROR(check_tools(body.at("tools"), "tools"));
    o.tools = body.at("tools");
  }
  if (present(body, "tool_choice"))
    ATTNRES_RETURN_IF_ERROR(parse_tool_choice(body.at("tool_choice"), o.tool_choice));
  if (present(body, "response_format"))
    ATTNRES_RETURN_IF_ERROR(parse_response_format(body.at("response_format"), o));
  ATTNRES_RETURN_IF_ERROR(parse_thinking(body, o));
  ATTNRES_RETURN_IF_ERROR(read_bool(body, "add_generation_prompt", "", o.add_generation_prompt));
  return req;
}

}  // namespace attnres
