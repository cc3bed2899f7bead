// Kimi-K3 output parsing; see chat_parse.h for the grammar and contract.
#include "tokenizer/chat_parse.h"

namespace attnres {
namespace {

using Json = nlohmann::ordered_json;

// Longest tag text kept (names and attributes of real tags are far shorter); a longer one is
// dropped whole at its <|sep|>.
constexpr size_t kMaxTagBytes = 4096;

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string unescape_attr(std::string_view v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    if (v.substr(i, 5) == "&amp;") {
      out += '&';
      i += 5;
    } else if (v.substr(i, 6) == "&quot;") {
      out += '"';
      i += 6;
    } else {
      out += v[i++];
    }
  }
  return out;
}

// A tag's text: NAME( KEY="VALUE")*. Attributes stop at the first malformed one.
struct Tag {
  std::string_view name;
  std::vector<std::pair<std::string_view, std::string>> attrs;

  const std::string* attr(std::string_view key) const {
    for (const auto& [k, v] : attrs)
      if (k == key) return &v;
    return nullptr;
  }
};

Tag parse_tag(std::string_view s) {
  Tag tag;
  size_t i = 0;
  while (i < s.size() && is_ascii_space(s[i])) ++i;
  const size_t name_begin = i;
  while (i < s.size() && !is_ascii_space(s[i])) ++i;
  tag.name = s.substr(name_begin, i - name_begin);
  while (i < s.size()) {
    while (i < s.size() && is_ascii_space(s[i])) ++i;
    const size_t eq = s.find('=', i);
    if (eq == std::string_view::npos || eq + 1 >= s.size() || s[eq + 1] != '"') break;
    const size_t end = s.find('"', eq + 2);
    if (end == std::string_view::npos) break;
    tag.attrs.push_back({s.substr(i, eq - i), unescape_attr(s.substr(eq + 2, end - eq - 2))});
    i = end + 1;
  }
  return tag;
}

void append_event(std::vector<ChatEvent>& out, ChatEventKind kind, std::string text) {
  if (text.empty()) return;
  if (!out.empty() && out.back().kind == kind && kind != ChatEventKind::kToolCall) {
    out.back().text += text;
    return;
  }
  ChatEvent e;
  e.kind = kind;
  e.text = std::move(text);
  out.push_back(std::move(e));
}

}  // namespace

Result<ChatPiece> chat_piece(const Tokenizer& tokenizer, TokenId id) {
  ATTNRES_ASSIGN_OR_RETURN(std::string_view bytes, tokenizer.token_bytes(id));
  return ChatPiece{std::string(bytes), tokenizer.is_special(id)};
}

std::string_view chat_finish_reason(const ChatParsed& parsed, bool hit_max_tokens) {
  if (!parsed.tool_calls.empty()) return "tool_calls";
  return hit_max_tokens ? "length" : "stop";
}

ChatOutputParser::ChatOutputParser(ChatParserOptions options)
    : options_(std::move(options)),
      state_(options_.thinking ? State::kReasoning : State::kContent) {}

std::vector<ChatEvent> ChatOutputParser::push(const ChatPiece& piece) {
  std::vector<ChatEvent> out;
  feed(piece, out);
  return out;
}

std::vector<ChatEvent> ChatOutputParser::push(std::span<const ChatPiece> pieces) {
  std::vector<ChatEvent> out;
  for (const ChatPiece& p : pieces) feed(p, out);
  return out;
}

std::vector<ChatEvent> ChatOutputParser::finish(ChatOutputEnd end) {
  std::vector<ChatEvent> out;
  if (state_ == State::kDone) return out;
  in_tag_ = false;  // a tag cut off by the end is dropped
  if (end == ChatOutputEnd::kEndOfMessage) {
    end_message(out);
    return out;
  }
  // Truncated: what was still being written (an open call, held whitespace) is dropped.
  in_call_ = false;
  flush_text(out);
  state_ = State::kDone;
  return out;
}

ChatParsed ChatOutputParser::result() const {
  ChatParsed p;
  if (!reasoning_.empty()) p.reasoning_content = reasoning_;
  if (!content_.empty()) p.content = content_;
  p.tool_calls = calls_;
  return p;
}

void ChatOutputParser::feed(const ChatPiece& piece, std::vector<ChatEvent>& out) {
  if (state_ == State::kDone) return;
  if (!piece.control) {
    if (!in_tag_) {
      on_text(piece.text, out);
    } else if (!tag_overflow_) {
      tag_ += piece.text;
      if (tag_.size() > kMaxTagBytes) {
        tag_overflow_ = true;
        tag_.clear();
      }
    }
    return;
  }
  const std::string_view marker = piece.text;
  if (marker == kOpenToken || marker == kCloseToken) {
    // A tag that was still open is malformed and dropped.
    in_tag_ = true;
    tag_close_ = marker == kCloseToken;
    tag_overflow_ = false;
    tag_.clear();
  } else if (marker == kSepToken) {
    if (!in_tag_) return;  // a stray separator
    in_tag_ = false;
    if (!tag_overflow_) on_tag(tag_close_, tag_, out);
  } else if (marker == kEndOfMsgToken) {
    in_tag_ = false;
    end_message(out);
  }
  // Other control tokens are not shown.
}

void ChatOutputParser::on_text(std::string_view text, std::vector<ChatEvent>& out) {
  switch (state_) {
    case State::kReasoning:
      emit_text(ChatEventKind::kReasoning, text, out);
      return;
    case State::kContent:
      emit_text(ChatEventKind::kContent, text, out);
      return;
    case State::kOutside: {
      outside_ += text;
      bool blank = true;
      for (char c : outside_) blank = blank && is_ascii_space(c);
      if (blank) return;
      // The model answers without opening `response`: what it wrote here is content.
      state_ = State::kContent;
      std::string held;
      held.swap(outside_);
      emit_text(ChatEventKind::kContent, held, out);
      return;
    }
    case State::kArgument:
    case State::kJson:
      value_.value += text;
      return;
    case State::kTools:
    case State::kCall:
    case State::kDone:
      return;  // markup space: not shown
  }
}

void ChatOutputParser::emit_text(ChatEventKind kind, std::string_view bytes,
                                 std::vector<ChatEvent>& out) {
  Utf8StreamDecoder& dec = kind == ChatEventKind::kReasoning ? reasoning_utf8_ : content_utf8_;
  std::string text = dec.push(bytes);
  (kind == ChatEventKind::kReasoning ? reasoning_ : content_) += text;
  append_event(out, kind, std::move(text));
}

// Leaving a text channel: an incomplete UTF-8 tail becomes U+FFFD; held whitespace is dropped.
void ChatOutputParser::flush_text(std::vector<ChatEvent>& out) {
  std::string r = reasoning_utf8_.flush();
  reasoning_ += r;
  append_event(out, ChatEventKind::kReasoning, std::move(r));
  std::string c = content_utf8_.flush();
  content_ += c;
  append_event(out, ChatEventKind::kContent, std::move(c));
  outside_.clear();
}

// Back to the top level of the message: text channels flushed, an open call emitted.
void ChatOutputParser::leave_to_top(std::vector<ChatEvent>& out) {
  flush_text(out);
  if (state_ == State::kArgument || state_ == State::kJson) close_value();
  if (in_call_) emit_call(out);
  state_ = State::kOutside;
}

void ChatOutputParser::close_value() {
  if (state_ == State::kArgument) {
    arguments_.push_back(std::move(value_));
  } else if (state_ == State::kJson) {
    json_block_ = std::move(value_.value);
  }
  value_ = Argument();
  state_ = State::kCall;
}

void ChatOutputParser::emit_call(std::vector<ChatEvent>& out) {
  in_call_ = false;
  std::vector<Argument> args;
  args.swap(arguments_);
  std::optional<std::string> block;
  block.swap(json_block_);
  if (call_name_.empty()) return;  // not a call
  ChatParsedToolCall call;
  call.index = calls_.size();
  call.id = options_.call_id_prefix + std::to_string(call.index);
  call.name = utf8_lossy(call_name_);
  if (!args.empty()) {
    Json obj = Json::object();
    for (Argument& a : args) {
      const std::string key = utf8_lossy(a.key);
      std::string raw = utf8_lossy(a.value);
      Json v;
      if (a.type != "string") v = Json::parse(raw, nullptr, /*allow_exceptions=*/false);
      if (a.type == "string" || v.is_discarded()) v = std::move(raw);
      obj[key] = std::move(v);
    }
    call.arguments = python_json_dumps(obj);
  } else if (block) {
    call.arguments = utf8_lossy(*block);
  } else {
    call.arguments = "{}";
  }
  calls_.push_back(call);
  ChatEvent e;
  e.kind = ChatEventKind::kToolCall;
  e.call = std::move(call);
  out.push_back(std::move(e));
}

void ChatOutputParser::end_message(std::vector<ChatEvent>& out) {
  leave_to_top(out);
  state_ = State::kDone;
}

void ChatOutputParser::on_tag(bool close, std::string_view text, std::vector<ChatEvent>& out) {
  const Tag tag = parse_tag(text);
  const std::string_view name = tag.name;
  const bool in_call =
      state_ == State::kCall || state_ == State::kArgument || state_ == State::kJson;
  if (name == "message") {  // a close ends the message; an open starts another one
    end_message(out);
    return;
  }
  if (!close) {
    if (name == "think" || name == "response" || name == "tools") {
      leave_to_top(out);
      state_ = name == "think"      ? State::kReasoning
               : name == "response" ? State::kContent
                                    : State::kTools;
    } else if (name == "call") {
      if (in_call) {
        if (state_ != State::kCall) close_value();
        emit_call(out);
      } else if (state_ != State::kTools) {
        leave_to_top(out);  // a call without the tools wrapper
      }
      in_call_ = true;
      const std::string* tool = tag.attr("tool");
      call_name_ = tool ? *tool : std::string();
      state_ = State::kCall;
    } else if ((name == "argument" || name == "json") && in_call) {
      if (state_ != State::kCall) close_value();
      value_ = Argument();
      if (name == "argument") {
        const std::string* key = tag.attr("key");
        const std::string* type = tag.attr("type");
        value_.key = key ? *key : std::string();
        value_.type = type ? *type : std::string("string");
        state_ = State::kArgument;
      } else {
        state_ = State::kJson;
      }
    }
    return;  // anything else is not markup the model writes: dropped
  }
  if (name == "think" && state_ == State::kReasoning) {
    flush_text(out);
    state_ = State::kOutside;
  } else if (name == "response" && state_ == State::kContent) {
    flush_text(out);
    state_ = State::kOutside;
  } else if ((name == "argument" && state_ == State::kArgument) ||
             (name == "json" && state_ == State::kJson)) {
    close_value();
  } else if (name == "call" && in_call) {
    if (state_ != State::kCall) close_value();
    emit_call(out);
    state_ = State::kTools;
  } else if (name == "tools" && (in_call || state_ == State::kTools)) {
    leave_to_top(out);
  }
}

ChatParsed parse_chat_output(std::span<const ChatPiece> pieces, const ChatParserOptions& options,
                             ChatOutputEnd end) {
  ChatOutputParser parser(options);
  parser.push(pieces);
  parser.finish(end);
  return parser.result();
}

}  // namespace attnres
