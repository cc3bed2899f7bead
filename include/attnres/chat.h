// The Kimi-K3 chat format for front ends (public API): OpenAI request bodies to prompts, exactly
// as the published template renders them (src/tokenizer/chat.h; docs/chat-format.md), and the
// model's output back to reasoning, content and tool calls, incrementally, with the same result
// for every split of the output (src/tokenizer/chat_parse.h).
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "attnres/chat_types.h"
#include "attnres/engine.h"

namespace attnres {

struct ChatPrompt {
  std::string text;             // the rendered prompt (what /apply-template returns)
  std::vector<int32_t> tokens;  // control markers as control tokens, all other text ordinary
  bool thinking = true;         // the generation prompt opened the think channel
};

// Renders a chat-completions request body: `messages`, `tools`, `tool_choice`,
// `response_format`, `chat_template_kwargs` {thinking, thinking_effort}, `reasoning_effort`,
// `add_generation_prompt`. Client mistakes are kInvalidArgument naming the field
// ("messages[3].role: ..."); a named tool_choice is kUnsupported. Needs the model's tokenizer.
Result<ChatPrompt> apply_chat_template(const Model& model, const nlohmann::ordered_json& body);

// The output parser of one generated message.
class ChatOutput {
 public:
  // `thinking`: the prompt's generation prompt opened think (ChatPrompt::thinking). Tool-call
  // ids are call_id_prefix + index.
  ChatOutput(const Model& model, bool thinking, std::string call_id_prefix);
  ~ChatOutput();
  ChatOutput(ChatOutput&&) noexcept;
  ChatOutput& operator=(ChatOutput&&) noexcept;

  // The events one generated token completes, in output order.
  Result<std::vector<ChatEvent>> push(int32_t token);
  // End of generation: the model ended its message (kEndOfMessage) or was cut off.
  std::vector<ChatEvent> finish(ChatOutputEnd end);
  ChatParsed message() const;
  // The model closed its message (its stop token or the message's close tag was seen).
  bool ended() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnres
