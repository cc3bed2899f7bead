// Kimi-K3 chat format ("XTML", k3-model.md §7): OpenAI-style requests rendered into the prompt.
//
// Contract: render_chat_template() produces exactly the text of the published template
// (tests/fixtures/kimi-k3/chat_template.jinja, a copy of ../shared/models/kimi-k3/) rendered by
// jinja2 as transformers configures it (pyjson.h says why that, and not jinja2's own tojson),
// split into segments: every control marker (<|open|>, <|close|>, <|sep|>, <|end_of_msg|>) is its
// own control segment and is encoded with control tokens allowed; every other segment (tag
// names, attributes, and all user, system, tool and model text) is encoded with them
// disallowed, so no text can produce a control token (as Kimi-K3's encoding_k3.py does).
// With O = <|open|>, S = <|sep|>, C = <|close|>, E = <|end_of_msg|>, the prompt is, in order:
//   tools declared        O message role="system" type="tool-declare" S # Tools ... ```json
//                           JSON_SORTED(tools) ``` C message S E
//   thinking on, effort   O message role="system" type="thinking-effort" S ... C message S E
//   messages              system/user: O message role="R"[ name="N"] S CONTENT C message S E
//                         system with `tools`: the tool-declare message, "New Tools" variant
//                         assistant: O message role="assistant"[ name="N"] S
//                           [thinking on: O think S REASONING C think S]
//                           O response S CONTENT C response S
//                           [O tools S, per call O call tool="NAME" index="i" S, per argument
//                            O argument key="K" type="T" S VALUE C argument S (strings raw,
//                            other values json.dumps), or O json type="object" S TEXT C json S,
//                            C call S, C tools S]
//                         C message S E
//                         tool: O message role="tool" tool="NAME" index="i" S CONTENT C message S E
//   tool_choice           none / required: a system message of type "tool-choice"
//   response_format       json_object / json_schema: a system message of type "response-format"
//   generation prompt     O message role="assistant" S O think S (thinking off: O response S)
// Attribute values escape `&` and `"`. REASONING is omitted when blank. A run of consecutive tool
// messages whose ids all match calls of the latest assistant message is put in call order and
// named after the calls; otherwise each keeps its order and is named by its `tool`/`name`, or by
// the call at its position. JSON_SORTED: compact JSON with keys in jinja2 dictsort order.
//
// parse_chat_request() reads the request fields the template uses and checks them; every client
// mistake is a Status naming the field as a JSON path (`messages[3].tool_calls[0].function.name`)
// with what was expected and what was found. Requests it accepts render exactly as the template
// renders the same values; the server answers a failed parse with HTTP 400.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tokenizer/pyjson.h"
#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace attnres {

enum class ChatRole { kSystem, kUser, kAssistant, kTool };

struct ChatToolCall {
  std::string name;
  std::string id;  // optional call id (empty: none), matched by a tool message's tool_call_id
  // An object renders one argument tag per key (in this order); a string renders a json block
  // holding it verbatim (unless blank); null renders nothing.
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();
  // The template's `_xtml_json_block`: when set, a json block with this text replaces the
  // arguments.
  std::optional<std::string> json_block;
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;
  // Content given as a list of text parts: rendered one after another (each its own segment)
  // instead of `content`.
  std::vector<std::string> content_parts;
  std::string reasoning;     // assistant only: the think part
  std::string name;          // system/user/assistant: optional name attribute (empty: none)
  std::string tool;          // tool only: tool name (empty: taken from the calls)
  std::string tool_call_id;  // tool only: optional id of the call this message answers
  std::vector<ChatToolCall> tool_calls;  // assistant only
  // system only: a non-empty array declares tools mid-conversation (the message's content is
  // then not rendered).
  nlohmann::ordered_json tools;
};

// A message with only a role and content (the common case; avoids aggregate initialisation,
// which -Wmissing-field-initializers rejects when fields are left out).
inline ChatMessage chat_message(ChatRole role, std::string content) {
  ChatMessage m;
  m.role = role;
  m.content = std::move(content);
  return m;
}

enum class ChatToolChoice { kAuto, kNone, kRequired };
enum class ChatResponseFormat { kText, kJsonObject, kJsonSchema };

// The template's variables other than `messages`. Defaults are the template's defaults, except
// add_generation_prompt (the template's default is false; a chat completion needs it).
struct ChatTemplateOptions {
  nlohmann::ordered_json tools;  // null or an array of tool declarations
  ChatToolChoice tool_choice = ChatToolChoice::kAuto;
  ChatResponseFormat response_format = ChatResponseFormat::kText;
  nlohmann::ordered_json response_schema;  // rendered for kJsonSchema
  bool thinking = true;
  // "low", "high" or "max" add the thinking-effort message (thinking on only); nullopt adds none.
  std::optional<std::string> thinking_effort = "max";
  bool add_generation_prompt = true;
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  ChatTemplateOptions options;
};

struct ChatRequestOptions {
  // Tool-call arguments given as a JSON string (as OpenAI clients send them) are parsed into an
  // object and rendered as argument tags, which is the form the model writes (vLLM's
  // _postprocess_messages and encoding_k3.py do the same). When false they are rendered as the
  // template renders a string: verbatim in a json block. Either way the string must hold a JSON
  // object (or be blank).
  bool parse_string_arguments = true;
};

// Reads an OpenAI chat-completions request body (a JSON object): `messages`, `tools`,
// `tool_choice` ("auto", "none", "required"; a named function is kUnsupported),
// `response_format` ({"type": "text" | "json_object" | "json_schema", "json_schema": {...}}),
// `chat_template_kwargs` {"thinking": bool, "thinking_effort": "low" | "high" | "max" | null},
// `reasoning_effort` ("none" turns thinking off; "low", "high", "max" set thinking_effort unless
// chat_template_kwargs does) and `add_generation_prompt` (default true). Other fields are
// ignored. Null means absent, except for thinking_effort, where null means no effort message.
Result<ChatRequest> parse_chat_request(const nlohmann::ordered_json& body,
                                       const ChatRequestOptions& options = {});
// Reads only an OpenAI message list; errors name `messages[i]...`.
Result<std::vector<ChatMessage>> parse_chat_messages(const nlohmann::ordered_json& messages,
                                                     const ChatRequestOptions& options = {});

struct ChatSegment {
  std::string text;
  bool control;  // encoded with control tokens allowed
};

// Renders messages with the template's other variables. Fails where the template raises: an
// unsupported thinking_effort, or a tool message whose tool name cannot be resolved.
Result<std::vector<ChatSegment>> render_chat_template(std::span<const ChatMessage> messages,
                                                      const ChatTemplateOptions& options);
inline Result<std::vector<ChatSegment>> render_chat_request(const ChatRequest& request) {
  return render_chat_template(request.messages, request.options);
}
// The prompt text (what /apply-template returns): the segments concatenated.
std::string chat_segments_text(std::span<const ChatSegment> segments);
// Token ids: control segments with control tokens allowed, all others without. Fails if the
// tokenizer lacks a chat control token.
Result<std::vector<TokenId>> encode_chat_segments(const Tokenizer& tokenizer,
                                                  std::span<const ChatSegment> segments);

// The text front ends' form: no tools, no notes and no thinking-effort message.
struct ChatOptions {
  bool thinking = true;               // render think parts and open <|open|>think
  bool add_generation_prompt = true;  // end with the opening of the assistant's turn
};

Result<std::vector<ChatSegment>> render_chat(std::span<const ChatMessage> messages,
                                             const ChatOptions& options);

// Renders and encodes. Fails if the tokenizer lacks a chat control token.
Result<std::vector<TokenId>> encode_chat(const Tokenizer& tokenizer,
                                         std::span<const ChatMessage> messages,
                                         const ChatOptions& options);

// parse_chat_messages with string arguments parsed (the text front ends' message files).
Result<std::vector<ChatMessage>> chat_messages_from_json(const nlohmann::ordered_json& messages);

}  // namespace attnres
