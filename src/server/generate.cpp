// The generating routes of `attnres serve`: POST /v1/chat/completions and POST /v1/completions,
// streaming (SSE) and not, over the engine loop.
//
// One driver (drive()) runs a request on the loop for both routes: it waits on the request's
// channel and the client's socket together, so a client that goes away is cancelled in the
// engine before its next step; it sends SSE comment pings while the stream is silent (a long
// prefill); and it turns engine events into output through an Output (chat: reasoning, content
// and tool calls by ChatOutput, stop strings on the parsed text; text: the engine's text).
// Streaming and non-streaming responses are built from the same deltas, so they are equal.
//
// Wire format (docs/serving.md): chunks `data: {json}\n\n`, then `data: [DONE]`; the first chat
// chunk carries only delta.role; the finish chunk carries no content; with
// stream_options.include_usage a last chunk with `choices: []` and usage. An error before
// anything was sent is a plain HTTP error; after, one `data: {"error": ...}` event and the
// stream ends without [DONE].
#include <chrono>
#include <ctime>

#include "attnres/chat.h"
#include "server/state.h"
#include "tokenizer/stop.h"
#include "tokenizer/tokenizer.h"

namespace attnres::server {

using json = nlohmann::ordered_json;

namespace {

using Clock = std::chrono::steady_clock;

// The tokens a logprobs entry shows: the token's bytes (U+FFFD where they are not UTF-8 on
// their own) and the raw bytes.
struct TokenText {
  std::string text;
  json bytes = json::array();
};

TokenText token_text(const Model& model, int32_t id) {
  TokenText t;
  const Tokenizer* tok = model.tokenizer();
  if (tok == nullptr) return t;
  auto b = tok->token_bytes(id);
  if (!b.is_ok()) return t;
  for (unsigned char c : *b) t.bytes.push_back(static_cast<int>(c));
  auto d = model.decode(std::span<const int32_t>(&id, 1));
  t.text = d.is_ok() ? *d : std::string(*b);
  return t;
}

// Turns engine events into the route's chunks and final body.
class Output {
 public:
  virtual ~Output() = default;
  // Chunks to send before any token (chat: the role chunk).
  virtual void begin(std::vector<json>& chunks) = 0;
  // One engine token event; returns true when the output is complete (a stop string matched,
  // the message closed) and the generation should be cancelled.
  virtual bool token(const TokenEvent& e, std::vector<json>& chunks) = 0;
  // The end (not an error): the last chunks, the finish chunk included.
  virtual void finish(const GenerationResult& r, std::vector<json>& chunks) = 0;
  // The non-streaming choice.
  virtual json choice() const = 0;
  int64_t completion_tokens = 0;
};

// Chat: the parser's reasoning and content pass a stop-string matcher each (a stop string in
// either ends the output, and is not shown); tool calls are emitted whole.
class ChatOut final : public Output {
 public:
  ChatOut(const Model& model, bool thinking, const std::string& call_prefix,
          std::vector<std::string> stops, int top_logprobs)
      : model_(model),
        parser_(model, thinking, call_prefix),
        reasoning_stop_(stops),
        content_stop_(stops),
        top_logprobs_(top_logprobs) {}

  void begin(std::vector<json>& chunks) override {
    chunks.push_back(chunk({{"role", "assistant"}}));
  }

  bool token(const TokenEvent& e, std::vector<json>& chunks) override {
    if (e.token < 0 || stopped_) return stopped_;  // the engine's end-of-text tail: not used
    ++completion_tokens;
    if (top_logprobs_ >= 0) {
      json entry = logprob_entry(e);
      all_logprobs_.push_back(entry);
      pending_logprobs_.push_back(std::move(entry));
    }
    auto events = parser_.push(e.token);
    if (events.is_ok()) apply(*events, chunks);
    if (parser_.ended()) ended_ = true;
    return stopped_ || ended_;
  }

  void finish(const GenerationResult& r, std::vector<json>& chunks) override {
    const bool by_length = r.reason == FinishReason::kLength || r.reason == FinishReason::kContext;
    if (!stopped_) {
      const bool end_of_message = ended_ || r.reason == FinishReason::kStopToken;
      apply(
          parser_.finish(end_of_message ? ChatOutputEnd::kEndOfMessage : ChatOutputEnd::kTruncated),
          chunks);
    }
    if (!stopped_) {
      emit_text("reasoning_content", reasoning_, reasoning_stop_.flush(), chunks);
      emit_text("content", content_, content_stop_.flush(), chunks);
    }
    ChatParsed p;
    if (!reasoning_.empty()) p.reasoning_content = reasoning_;
    if (!content_.empty()) p.content = content_;
    p.tool_calls = calls_;
    finish_reason_ = std::string(chat_finish_reason(p, by_length && !stopped_ && !ended_));
    json c = chunk(json::object());
    c["choices"][0]["finish_reason"] = finish_reason_;
    attach_logprobs(c);
    chunks.push_back(std::move(c));
  }

  json choice() const override {
    json msg = {{"role", "assistant"}};
    msg["content"] = content_.empty() ? json(nullptr) : json(content_);
    if (!reasoning_.empty()) msg["reasoning_content"] = reasoning_;
    if (!calls_.empty()) {
      json calls = json::array();
      for (const auto& c : calls_) calls.push_back(call_json(c, false));
      msg["tool_calls"] = std::move(calls);
    }
    json ch = {{"index", 0}, {"message", std::move(msg)}};
    ch["logprobs"] = top_logprobs_ >= 0 ? json{{"content", all_logprobs_}} : json(nullptr);
    ch["finish_reason"] = finish_reason_;
    return ch;
  }

 private:
  static json chunk(json delta) {
    json ch = {{"index", 0}, {"delta", std::move(delta)}};
    ch["finish_reason"] = nullptr;
    return {{"choices", json::array({std::move(ch)})}};
  }
  static json call_json(const ChatParsedToolCall& c, bool with_index) {
    json j;
    if (with_index) j["index"] = c.index;
    j["id"] = c.id;
    j["type"] = "function";
    j["function"] = {{"name", c.name}, {"arguments", c.arguments}};
    return j;
  }
  json logprob_entry(const TokenEvent& e) const {
    const TokenText t = token_text(model_, e.token);
    json top = json::array();
    for (const TokenLogprob& alt : e.top) {
      const TokenText a = token_text(model_, alt.token);
      top.push_back({{"token", a.text}, {"logprob", alt.logprob}, {"bytes", a.bytes}});
    }
    return {{"token", t.text},
            {"logprob", e.logprob},
            {"bytes", t.bytes},
            {"top_logprobs", std::move(top)}};
  }
  void attach_logprobs(json& c) {
    if (top_logprobs_ < 0 || pending_logprobs_.empty()) return;
    c["choices"][0]["logprobs"] = {{"content", pending_logprobs_}};
    pending_logprobs_ = json::array();
  }
  void emit_text(const char* field, std::string& acc, const std::string& text,
                 std::vector<json>& chunks) {
    if (text.empty()) return;
    acc += text;
    json c = chunk({{field, text}});
    attach_logprobs(c);
    chunks.push_back(std::move(c));
  }
  void apply(const std::vector<ChatEvent>& events, std::vector<json>& chunks) {
    for (const ChatEvent& ev : events) {
      if (stopped_) return;
      switch (ev.kind) {
        case ChatEventKind::kReasoning:
          emit_text("reasoning_content", reasoning_, reasoning_stop_.push(ev.text), chunks);
          stopped_ = reasoning_stop_.stopped();
          break;
        case ChatEventKind::kContent:
          emit_text("content", content_, content_stop_.push(ev.text), chunks);
          stopped_ = content_stop_.stopped();
          break;
        case ChatEventKind::kToolCall: {
          calls_.push_back(ev.call);
          json c = chunk({{"tool_calls", json::array({call_json(ev.call, true)})}});
          attach_logprobs(c);
          chunks.push_back(std::move(c));
          break;
        }
      }
    }
  }

  const Model& model_;
  ChatOutput parser_;
  StopStringMatcher reasoning_stop_, content_stop_;
  int top_logprobs_;
  bool stopped_ = false, ended_ = false;
  std::string reasoning_, content_;
  std::vector<ChatParsedToolCall> calls_;
  json all_logprobs_ = json::array(), pending_logprobs_ = json::array();
  std::string finish_reason_;
};

// Text completions: the engine's text (its stop strings, control tokens shown by name).
class TextOut final : public Output {
 public:
  TextOut(const Model& model, std::string echo, int logprobs)
      : model_(model), echo_(std::move(echo)), logprobs_(logprobs) {}

  void begin(std::vector<json>& chunks) override {
    if (!echo_.empty()) emit(echo_, chunks);
    text_ = echo_;
  }
  bool token(const TokenEvent& e, std::vector<json>& chunks) override {
    if (e.token >= 0) {
      ++completion_tokens;
      if (logprobs_ >= 0) {
        const TokenText t = token_text(model_, e.token);
        json top = json::object();
        for (const TokenLogprob& alt : e.top) top[token_text(model_, alt.token).text] = alt.logprob;
        for (json* lp : {&all_, &pending_}) {
          (*lp)["tokens"].push_back(t.text);
          (*lp)["token_logprobs"].push_back(e.logprob);
          (*lp)["top_logprobs"].push_back(top);
          (*lp)["text_offset"].push_back(offset_);
        }
        offset_ += static_cast<int64_t>(t.text.size());
      }
    }
    text_ += e.text;
    if (!e.text.empty()) emit(e.text, chunks);
    return false;
  }
  void finish(const GenerationResult& r, std::vector<json>& chunks) override {
    finish_reason_ =
        r.reason == FinishReason::kLength || r.reason == FinishReason::kContext ? "length" : "stop";
    json c = chunk("");
    c["choices"][0]["finish_reason"] = finish_reason_;
    attach(c);
    chunks.push_back(std::move(c));
  }
  json choice() const override {
    json ch = {{"index", 0}, {"text", text_}};
    ch["logprobs"] = logprobs_ >= 0 ? all_ : json(nullptr);
    ch["finish_reason"] = finish_reason_;
    return ch;
  }

 private:
  static json empty_logprobs() {
    return {{"tokens", json::array()},
            {"token_logprobs", json::array()},
            {"top_logprobs", json::array()},
            {"text_offset", json::array()}};
  }
  static json chunk(const std::string& text) {
    json ch = {{"index", 0}, {"text", text}};
    ch["logprobs"] = nullptr;
    ch["finish_reason"] = nullptr;
    return {{"choices", json::array({std::move(ch)})}};
  }
  void attach(json& c) {
    if (logprobs_ < 0 || pending_["tokens"].empty()) return;
    c["choices"][0]["logprobs"] = pending_;
    pending_ = empty_logprobs();
  }
  void emit(const std::string& text, std::vector<json>& chunks) {
    json c = chunk(text);
    attach(c);
    chunks.push_back(std::move(c));
  }

  const Model& model_;
  std::string echo_;
  int logprobs_;
  std::string text_;
  int64_t offset_ = 0;
  json all_ = empty_logprobs(), pending_ = empty_logprobs();
  std::string finish_reason_;
};

struct RouteInfo {
  std::string id;
  const char* object;        // "chat.completion" / "text_completion"
  const char* chunk_object;  // "chat.completion.chunk" / "text_completion"
  bool stream = false;
  bool include_usage = false;
  int64_t prompt_tokens = 0;
};

json usage_json(const RouteInfo& ri, int64_t completion, int64_t cached) {
  return {{"prompt_tokens", ri.prompt_tokens},
          {"completion_tokens", completion},
          {"total_tokens", ri.prompt_tokens + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

// Runs `g` on the loop and answers the request (streaming or not).
void drive(ServerState& s, GenerationRequest g, Output& out, const RouteInfo& ri,
           HttpResponder& res, RequestLog& log) {
  const auto t0 = Clock::now();
  auto ch = std::make_shared<RequestChannel>();
  log.prompt_tokens = ri.prompt_tokens;
  if (!s.loop->try_submit(std::move(g), ch)) {
    ApiError e = api_error(503,
                           "the server is busy: " + std::to_string(s.loop->capacity()) +
                               " requests are running or queued (--parallel + --queue); retry "
                               "later",
                           "", "server_busy");
    send_error(res, e, log);
    return;
  }
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  auto stamp = [&](json c) {
    json o = {
        {"id", ri.id}, {"object", ri.chunk_object}, {"created", created}, {"model", s.model_id}};
    for (auto& [k, v] : c.items()) o[k] = v;
    return o;
  };
  std::vector<json> pending;
  out.begin(pending);
  // The stream starts (status line, role chunk) with the first token or the first ping, so an
  // error before either is still a plain HTTP error.
  bool started = false, broken = false, server_stop = false, accepted = false, any = false;
  auto start_stream = [&] {
    if (started) return;
    started = true;
    ++s.streams_active;
    broken = !res.start_stream(200, "text/event-stream",
                               {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}});
  };
  auto flush = [&] {
    if (!ri.stream || pending.empty() || !(started || any)) return;
    start_stream();
    std::string data;
    for (json& c : pending) data += "data: " + wire(stamp(std::move(c))) + "\n\n";
    pending.clear();
    if (!broken) broken = !res.write_chunk(data);
  };
  auto client_gone = [&] {
    s.loop->cancel(ch);
    ++s.client_aborts;
    log.status = 499;
    log.note = "client closed";
    if (started) --s.streams_active;
  };
  GenerationResult result;
  bool done = false, shutdown = false;
  while (!done) {
    const auto w = res.wait(ch->wake_fd(), s.opt.ping_interval_ms);
    if (w == HttpResponder::Wait::kPeerClosed) return client_gone();
    if (w == HttpResponder::Wait::kTimeout) {
      if (ri.stream && accepted) {
        start_stream();
        if (!broken) broken = !res.write_chunk(": ping\n\n");
      }
      if (broken) return client_gone();
      continue;
    }
    for (LoopEvent& e : ch->take()) {
      switch (e.kind) {
        case LoopEvent::Kind::kRejected:
          send_error(res, status_error(e.status), log);
          return;
        case LoopEvent::Kind::kAccepted:
          accepted = true;
          break;
        case LoopEvent::Kind::kToken:
          if (server_stop) break;
          any = true;
          if (log.ttft_seconds < 0)
            log.ttft_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
          if (out.token(e.token, pending)) {
            server_stop = true;
            s.loop->cancel(ch);
          }
          break;
        case LoopEvent::Kind::kFinished:
          result = std::move(e.result);
          shutdown = e.shutdown;
          done = true;
          break;
      }
    }
    flush();
    if (broken) return client_gone();
  }
  log.cached_tokens = result.cached_tokens;
  log.completion_tokens = out.completion_tokens;
  const bool failed = result.reason == FinishReason::kError ||
                      (result.reason == FinishReason::kCancelled && !server_stop);
  if (failed) {
    ApiError e = shutdown ? api_error(503, "the server is shutting down", "", "shutdown")
                 : result.reason == FinishReason::kError
                     ? api_error(500, "generation failed: " + result.error.to_string())
                     : api_error(500, "the generation was cancelled");
    if (!started) return send_error(res, e, log);
    log.status = e.status;
    log.note = e.message;
    res.write_chunk("data: " + wire(error_json(e)) + "\n\n");
    res.end_stream();
    --s.streams_active;
    return;
  }
  out.finish(result, pending);
  any = true;
  const json usage = usage_json(ri, out.completion_tokens, result.cached_tokens);
  log.status = 200;
  if (!ri.stream) {
    json body = {{"id", ri.id}, {"object", ri.object}, {"created", created}, {"model", s.model_id}};
    body["choices"] = json::array({out.choice()});
    body["usage"] = usage;
    send_json(res, 200, body);
    return;
  }
  if (ri.include_usage) pending.push_back({{"choices", json::array()}, {"usage", usage}});
  flush();
  if (!broken) broken = !res.write_chunk("data: [DONE]\n\n");
  if (!broken) res.end_stream();
  --s.streams_active;
}

// The engine request of the common fields.
GenerationRequest engine_request(const GenerationFields& f, std::vector<int32_t> prompt) {
  GenerationRequest g;
  g.prompt = std::move(prompt);
  g.sampling = f.sampling;
  if (!f.seed_given)
    g.sampling.seed = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  g.max_new_tokens = f.max_tokens.value_or(-1);
  g.strict_context = f.max_tokens.has_value();
  g.logit_bias = f.logit_bias;
  g.top_logprobs = f.top_logprobs;
  g.use_prefix_cache = f.cache_prompt;
  g.ignore_eos = f.ignore_eos;
  return g;
}

bool forced_tokens(ServerState& s, const GenerationFields& f, GenerationRequest& g,
                   HttpResponder& res, RequestLog& log) {
  if (!f.forced_output) return true;
  auto ids = s.model->encode(*f.forced_output, /*allow_special=*/true);
  if (!ids.is_ok()) {
    send_error(
        res,
        api_error(400, "attnres_forced_output: " + ids.status().message(), "attnres_forced_output"),
        log);
    return false;
  }
  g.forced_tokens = std::move(ids).value();
  return true;
}

// The context check with the message clients expect (vLLM's wording is what SDKs show).
bool check_context(ServerState& s, const GenerationFields& f, int64_t prompt_tokens,
                   HttpResponder& res, RequestLog& log) {
  const int64_t ctx = s.loop->context_length();
  const int64_t want = f.max_tokens.value_or(1);
  if (prompt_tokens + want <= ctx && prompt_tokens < ctx) return true;
  const std::string msg =
      "This model's maximum context length is " + std::to_string(ctx) +
      " tokens. However, you requested " + std::to_string(prompt_tokens + want) + " tokens (" +
      std::to_string(prompt_tokens) + " in the messages, " + std::to_string(want) +
      (f.max_tokens ? " in the completion)." : " at least in the completion).") +
      " Please reduce the length of the messages or completion.";
  send_error(
      res, api_error(400, msg, f.max_tokens ? "max_tokens" : "messages", "context_length_exceeded"),
      log);
  return false;
}

}  // namespace

void handle_chat_completion(ServerState& s, const HttpRequest& req, HttpResponder& res,
                            RequestLog& log) {
  auto body = parse_json_body(req.header("content-type"), req.body);
  if (!body.ok()) return send_error(res, body.error, log);
  auto p = parse_chat_completion(*body.value, s.limits);
  if (!p.ok()) return send_error(res, p.error, log);
  log.stream = p.value->gen.stream;
  auto prompt = apply_chat_template(*s.model, *body.value);
  if (!prompt.is_ok()) return send_error(res, status_error(prompt.status()), log);
  const GenerationFields& f = p.value->gen;
  const auto n = static_cast<int64_t>(prompt->tokens.size());
  if (!check_context(s, f, n, res, log)) return;
  GenerationRequest g = engine_request(f, std::move(prompt->tokens));
  g.snapshot_at_end = true;  // the next turn's prompt starts with this whole exchange
  if (!forced_tokens(s, f, g, res, log)) return;
  RouteInfo ri;
  ri.id = s.new_id("chatcmpl-");
  log.id = ri.id;
  ri.object = "chat.completion";
  ri.chunk_object = "chat.completion.chunk";
  ri.stream = f.stream;
  ri.include_usage = f.include_usage;
  ri.prompt_tokens = n;
  ChatOut out(*s.model, prompt->thinking, "call_" + ri.id.substr(9) + "_", f.stop, f.top_logprobs);
  drive(s, std::move(g), out, ri, res, log);
}

void handle_completion(ServerState& s, const HttpRequest& req, HttpResponder& res,
                       RequestLog& log) {
  auto body = parse_json_body(req.header("content-type"), req.body);
  if (!body.ok()) return send_error(res, body.error, log);
  auto p = parse_completion(*body.value, s.limits);
  if (!p.ok()) return send_error(res, p.error, log);
  CompletionRequest& c = *p.value;
  log.stream = c.gen.stream;
  std::vector<int32_t> ids = c.prompt_ids;
  std::string echo;
  if (c.prompt_text) {
    auto e = s.model->encode(*c.prompt_text);
    if (!e.is_ok()) return send_error(res, status_error(e.status()), log);
    ids = std::move(e).value();
    if (ids.empty())
      return send_error(res, api_error(400, "prompt: encodes to no tokens", "prompt"), log);
    if (c.echo) echo = *c.prompt_text;
  } else if (c.echo) {
    auto d = s.model->decode(ids);
    if (d.is_ok()) echo = *d;
  }
  if (c.echo && c.gen.top_logprobs >= 0)
    return send_error(
        res, api_error(400, "echo: not supported together with logprobs", "echo", "unsupported"),
        log);
  const auto n = static_cast<int64_t>(ids.size());
  if (!check_context(s, c.gen, n, res, log)) return;
  GenerationRequest g = engine_request(c.gen, std::move(ids));
  g.stop_strings = c.gen.stop;
  if (!forced_tokens(s, c.gen, g, res, log)) return;
  RouteInfo ri;
  ri.id = s.new_id("cmpl-");
  log.id = ri.id;
  ri.object = "text_completion";
  ri.chunk_object = "text_completion";
  ri.stream = c.gen.stream;
  ri.include_usage = c.gen.include_usage;
  ri.prompt_tokens = n;
  TextOut out(*s.model, echo, c.gen.top_logprobs);
  drive(s, std::move(g), out, ri, res, log);
}

}  // namespace attnres::server
