// Kimi-K3 chat format ("XTML", k3-model.md §7) rendered to tokens.
//
// Contract: render_chat() turns a conversation into segments exactly as Kimi-K3's
// encoding_k3.py build_chat_segments does for text conversations: tags are
// `<|open|>` NAME[ KEY="VALUE"]... `<|sep|>` and `<|close|>` NAME `<|sep|>`, each message
// ends with `<|end_of_msg|>`, attribute values escape `&` and `"`; every text segment is encoded
// on its own with control tokens DISALLOWED (so user, tool and model text can never produce a
// control token) and only the control markers themselves are encoded with them allowed.
// Messages, with O = <|open|>, S = <|sep|>, C = <|close|>, E = <|end_of_msg|>:
//   system/user  O message role="R"[ name="N"] S CONTENT C message S E
//   assistant    O message role="assistant" S
//                  [thinking on: O think S REASONING C think S]
//                  O response S CONTENT C response S
//                  [tool calls: O tools S, per call O call tool="NAME" index="i" S,
//                   per argument O argument key="K" type="T" S VALUE C argument S,
//                   C call S per call, C tools S]
//                C message S E
//   tool         O message role="tool" tool="NAME" index="i" S CONTENT C message S E
//   generation prompt: O message role="assistant" S O think S (thinking off: O response S)
// REASONING is omitted when blank. A tool message whose tool_call_id matches a call of the
// preceding assistant message is named after that call; a run of consecutive tool messages that
// all match is put in call order. A tool message without a name otherwise takes the name of the
// i-th call of the preceding assistant message.
// Argument values that are strings are written as is, others as Python's json.dumps (", " and ": "
// separators, non-ASCII kept). Not covered (no text-only use yet): images, tool declarations,
// thinking_effort, tool_choice and response_format notes.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "util/status.h"

namespace attnres {

enum class ChatRole { kSystem, kUser, kAssistant, kTool };

struct ChatToolCall {
  std::string name;
  std::string id;  // optional call id, matched by a tool message's tool_call_id
  nlohmann::ordered_json arguments = nlohmann::ordered_json::object();  // key order is kept
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;
  std::string reasoning;     // assistant only: the think part
  std::string name;          // system/user: optional name attribute
  std::string tool;          // tool only: tool name (else taken from the preceding calls)
  std::string tool_call_id;  // tool only: optional id of the call this message answers
  std::vector<ChatToolCall> tool_calls;  // assistant only
};

// A message with only a role and content (the common case; avoids aggregate initialisation,
// which -Wmissing-field-initializers rejects when fields are left out).
inline ChatMessage chat_message(ChatRole role, std::string content) {
  ChatMessage m;
  m.role = role;
  m.content = std::move(content);
  return m;
}

struct ChatOptions {
  bool thinking = true;               // render think parts and open <|open|>think
  bool add_generation_prompt = true;  // end with the opening of the assistant's turn
};

struct ChatSegment {
  std::string text;
  bool control;  // encoded with control tokens allowed
};

Result<std::vector<ChatSegment>> render_chat(std::span<const ChatMessage> messages,
                                             const ChatOptions& options);

// Renders and encodes. Fails if the tokenizer lacks a chat control token.
Result<std::vector<TokenId>> encode_chat(const Tokenizer& tokenizer,
                                         std::span<const ChatMessage> messages,
                                         const ChatOptions& options);

// OpenAI-style messages: [{"role", "content", "reasoning_content"|"reasoning", "name",
// "tool"|"name" and "tool_call_id"|"id" (tool messages), "tool_calls": [{"id", "function":
// {"name", "arguments"}} | {"id", "name", "arguments"}]}]; arguments may be an object or a JSON
// object string. Errors name the message index.
Result<std::vector<ChatMessage>> chat_messages_from_json(const nlohmann::ordered_json& messages);

// Python json.dumps(value, ensure_ascii=False) with its default separators.
std::string python_json_dumps(const nlohmann::ordered_json& value);

}  // namespace attnres
