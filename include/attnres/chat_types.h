// What the Kimi-K3 chat output parser produces (public API types; the parser is
// src/tokenizer/chat_parse.h, its front-end facade include/attnres/chat.h).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnres {

struct ChatParsedToolCall {
  size_t index = 0;
  std::string id;
  std::string name;
  std::string arguments;  // a JSON text
};

enum class ChatEventKind { kReasoning, kContent, kToolCall };

struct ChatEvent {
  ChatEventKind kind = ChatEventKind::kContent;
  std::string text;         // kReasoning, kContent: text to append (valid UTF-8)
  ChatParsedToolCall call;  // kToolCall
};

struct ChatParsed {
  std::optional<std::string> reasoning_content;  // absent when the output has none
  std::optional<std::string> content;            // absent when the output has none
  std::vector<ChatParsedToolCall> tool_calls;
};

// How generation ended: the model ended its message (its stop token), or it was cut off
// (max_tokens, a stop string, cancellation).
enum class ChatOutputEnd { kEndOfMessage, kTruncated };

// OpenAI finish_reason: "tool_calls" when any call was produced, else "length" when generation
// hit max_tokens, else "stop".
std::string_view chat_finish_reason(const ChatParsed& parsed, bool hit_max_tokens);

}  // namespace attnres
