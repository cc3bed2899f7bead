// Kimi-K3 model output (XTML, see chat.h) parsed into reasoning_content, content and tool calls,
// incrementally: what a chat-completions server streams as deltas.
//
// Input: the generated tokens as pieces {text, control} (chat_piece(): a control token gives its
// name with control = true, any other token its bytes). Only control pieces are markup, so text
// that spells "<|open|>" is text. The output after the generation prompt
//   O message role="assistant" S O think S        (thinking on; off: ... O response S)
// is read as a small grammar with implicit closes, so that every way the model leaves a channel
// works (O = <|open|>, C = <|close|>, S = <|sep|>):
//   O think S / C think S          enter / leave the reasoning channel (the last one decides)
//   O response S / C response S    enter / leave the content channel
//   O tools S, O call tool="N" S, O argument key="K" type="T" S VALUE C argument S,
//   O json type="object" S TEXT C json S, C call S, C tools S
//   C message S or <|end_of_msg|>  end of the message: later pieces are ignored
// Opening think, response or tools leaves whatever channel or call is open (so `tools` straight
// from `think`, or `response` without `C think S`, work); `C message S` closes everything. A
// tag's text (name and attributes, ordinary tokens) is collected up to its `S` and never shown;
// a tag cut short by another marker, an unknown tag and a close that matches nothing are
// dropped. Text between the think and response channels becomes content once it holds
// anything but ASCII whitespace (a model that answers without opening `response`); whitespace
// alone there, and any text inside `tools` or `call` outside an argument, is dropped. Other
// control tokens are not shown.
//
// Tool calls are emitted whole, one event per call, when the call is closed: by `C call S`, or
// implicitly by the next call, `C tools S`, `C message S`, <|end_of_msg|> or finish(kEndOfMessage).
// A call still open when the output is truncated is dropped, and so is a call tag without a
// tool attribute. A call's arguments string is json.dumps(ensure_ascii=False) of an object with
// one key per argument in order: type="string" values are the raw text, other types are the
// text parsed as JSON (kept as a string when it does not parse); a call given as a json block
// gets the block's text verbatim; a call with neither gets "{}". Ids are
// `call_id_prefix + index`, index counting emitted calls from 0. Attribute values are
// unescaped (&amp; and &quot;).
//
// Streaming equals one-shot: the events of any split of the same pieces into push() calls
// concatenate to the same reasoning, content and calls, because every decision depends only on
// the marker sequence and the bytes, never on chunk boundaries. Text events are valid UTF-8:
// each channel's bytes go through a streaming UTF-8 decoder that holds back an incomplete
// character and is flushed (U+FFFD for an incomplete tail) when the channel is left.
//
// Thread-safety: a ChatOutputParser is single-threaded state; the free functions are pure.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "attnres/chat_types.h"
#include "tokenizer/chat.h"
#include "tokenizer/utf8.h"

namespace attnres {

// One piece of model output: a control token (its name) or ordinary text bytes.
using ChatPiece = ChatSegment;

// The piece of one generated token. Unknown ids are an error.
Result<ChatPiece> chat_piece(const Tokenizer& tokenizer, TokenId id);

struct ChatParserOptions {
  bool thinking = true;                  // the generation prompt opened think (else response)
  std::string call_id_prefix = "call_";  // ids are prefix + index; give each response its own
};

// The parser for the output of a rendered request: it starts in the channel that the request's
// generation prompt opened.
inline ChatParserOptions chat_parser_options(const ChatTemplateOptions& request,
                                             std::string call_id_prefix = "call_") {
  ChatParserOptions o;
  o.thinking = request.thinking;
  o.call_id_prefix = std::move(call_id_prefix);
  return o;
}

class ChatOutputParser {
 public:
  explicit ChatOutputParser(ChatParserOptions options = {});

  // Feeds pieces; returns the events they complete, in output order (consecutive text of one
  // kind merged).
  std::vector<ChatEvent> push(const ChatPiece& piece);
  std::vector<ChatEvent> push(std::span<const ChatPiece> pieces);
  // End of generation: flushes held text and, for kEndOfMessage, closes an open call.
  std::vector<ChatEvent> finish(ChatOutputEnd end);

  // Everything emitted so far.
  ChatParsed result() const;
  // The message ended (C message S or <|end_of_msg|> was seen, or finish() was called).
  bool ended() const { return state_ == State::kDone; }

 private:
  enum class State { kReasoning, kContent, kOutside, kTools, kCall, kArgument, kJson, kDone };
  struct Argument {
    std::string key;
    std::string type;
    std::string value;  // raw bytes
  };

  void feed(const ChatPiece& piece, std::vector<ChatEvent>& out);
  void on_tag(bool close, std::string_view tag, std::vector<ChatEvent>& out);
  void on_text(std::string_view text, std::vector<ChatEvent>& out);
  void emit_text(ChatEventKind kind, std::string_view bytes, std::vector<ChatEvent>& out);
  void flush_text(std::vector<ChatEvent>& out);
  void leave_to_top(std::vector<ChatEvent>& out);
  void close_value();
  void emit_call(std::vector<ChatEvent>& out);
  void end_message(std::vector<ChatEvent>& out);

  ChatParserOptions options_;
  State state_;
  // A tag being read: after <|open|> or <|close|>, until <|sep|>.
  bool in_tag_ = false;
  bool tag_close_ = false;
  bool tag_overflow_ = false;
  std::string tag_;
  std::string outside_;  // whitespace held between channels
  Utf8StreamDecoder reasoning_utf8_;
  Utf8StreamDecoder content_utf8_;
  // The open call.
  bool in_call_ = false;
  std::string call_name_;
  std::vector<Argument> arguments_;
  std::optional<std::string> json_block_;
  Argument value_;  // the open argument (kArgument) or json block (kJson)
  std::string reasoning_;
  std::string content_;
  std::vector<ChatParsedToolCall> calls_;
};

// One-shot parse: the same as one ChatOutputParser fed all pieces, then finish(end).
ChatParsed parse_chat_output(std::span<const ChatPiece> pieces, const ChatParserOptions& options,
                             ChatOutputEnd end);

}  // namespace attnres
