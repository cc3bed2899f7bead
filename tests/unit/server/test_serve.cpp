// `attnres serve` over real HTTP on models/kjv (a trained model, real text): the wire format
// of serving.md §2, streaming equal to non-streaming, the parser on real and forced output,
// scheduling (cancellation within one step, queued cancels, backpressure), pings, shutdown,
// prefix reuse, metrics.
#include <atomic>
#include <cmath>
#include <future>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server_util.h"

namespace attnres::server::test {
namespace {

double metric(int port, const std::string& name) {
  const Reply r = get(port, "/metrics");
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  ADD_FAILURE() << "no metric " << name;
  return -1;
}

// Waits until `pred` holds (polling), up to `ms`.
template <typename F>
bool eventually(F pred, int ms = 20000) {
  for (int i = 0; i < ms / 10; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// What a chat response says, streamed or not.
struct ChatResult {
  json content, reasoning;  // null or string
  json tool_calls = json::array();
  std::string finish_reason;
  json usage;
  int chunks = 0;
};

ChatResult from_message(const json& body) {
  ChatResult r;
  const json& c = body["choices"][0];
  r.content = c["message"]["content"];
  r.reasoning = c["message"].contains("reasoning_content") ? c["message"]["reasoning_content"]
                                                           : json(nullptr);
  if (c["message"].contains("tool_calls")) r.tool_calls = c["message"]["tool_calls"];
  r.finish_reason = c["finish_reason"];
  r.usage = body["usage"];
  return r;
}

// Checks the SSE shape of a chat stream and accumulates it.
ChatResult from_stream(const Reply& reply) {
  ChatResult r;
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.header("content-type"), "text/event-stream");
  EXPECT_EQ(reply.header("x-accel-buffering"), "no");
  const Sse sse = parse_sse(reply.body);
  EXPECT_TRUE(sse.framing_ok) << reply.body;
  EXPECT_FALSE(sse.data.empty());
  if (sse.data.empty()) return r;
  EXPECT_EQ(sse.data.back(), "[DONE]");
  std::string id;
  std::string content, reasoning;
  bool any_content = false, any_reasoning = false, finished = false;
  for (size_t i = 0; i + 1 < sse.data.size(); ++i) {
    const json c = json::parse(sse.data[i], nullptr, false);
    EXPECT_TRUE(c.is_object()) << sse.data[i];
    if (i == 0) id = c["id"];
    EXPECT_EQ(c["id"], id);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (c["choices"].empty()) {  // the usage chunk: last before [DONE]
      EXPECT_EQ(i + 2, sse.data.size());
      r.usage = c["usage"];
      continue;
    }
    EXPECT_FALSE(finished) << "a content chunk after the finish chunk";
    const json& ch = c["choices"][0];
    const json& d = ch["delta"];
    if (i == 0) {
      EXPECT_EQ(d, json({{"role", "assistant"}})) << "the first chunk carries only the role";
    } else {
      EXPECT_FALSE(d.contains("role"));
    }
    if (!ch["finish_reason"].is_null()) {
      finished = true;
      r.finish_reason = ch["finish_reason"];
      EXPECT_EQ(d, json::object()) << "the finish chunk carries no content";
      continue;
    }
    if (d.contains("content")) {
      EXPECT_FALSE(d["content"].is_null());
      content += d["content"].get<std::string>();
      any_content = true;
    }
    if (d.contains("reasoning_content")) {
      EXPECT_FALSE(any_content) << "reasoning after content";
      reasoning += d["reasoning_content"].get<std::string>();
      any_reasoning = true;
    }
    if (d.contains("tool_calls")) {
      for (const json& t : d["tool_calls"]) {
        // The whole call in one delta; absent fields omitted, never null or "".
        EXPECT_TRUE(t["index"].is_number());
        EXPECT_TRUE(t["id"].is_string() && !t["id"].get<std::string>().empty());
        EXPECT_EQ(t["type"], "function");
        EXPECT_TRUE(t["function"]["name"].is_string());
        EXPECT_TRUE(t["function"]["arguments"].is_string());
        json call = t;
        call.erase("index");
        r.tool_calls.push_back(call);
      }
    }
    ++r.chunks;
  }
  EXPECT_TRUE(finished);
  r.content = any_content ? json(content) : json(nullptr);
  r.reasoning = any_reasoning ? json(reasoning) : json(nullptr);
  return r;
}

void expect_same(const ChatResult& a, const ChatResult& b) {
  EXPECT_EQ(a.content, b.content);
  EXPECT_EQ(a.reasoning, b.reasoning);
  EXPECT_EQ(a.tool_calls, b.tool_calls);
  EXPECT_EQ(a.finish_reason, b.finish_reason);
}

class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new TestServer(kjv_options()); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static int port() { return server_->port(); }
  static TestServer* server_;
};
TestServer* Serve::server_ = nullptr;

TEST_F(Serve, ModelsTokenizeDetokenizeApplyTemplate) {
  const Reply m = get(port(), "/v1/models");
  ASSERT_EQ(m.status, 200);
  const json mj = m.body_json();
  EXPECT_EQ(mj["object"], "list");
  EXPECT_EQ(mj["data"][0]["id"], "kjv");
  EXPECT_EQ(mj["data"][0]["meta"]["context_length"], 256);
  EXPECT_EQ(get(port(), "/v1/models/kjv").status, 200);
  EXPECT_EQ(get(port(), "/v1/models/other").status, 404);

  const std::string text = "In the beginning God created the heaven and the earth.";
  const Reply t = post(port(), "/tokenize", {{"content", text}});
  ASSERT_EQ(t.status, 200) << t.body;
  const json ids = t.body_json()["tokens"];
  EXPECT_GT(ids.size(), 5u);
  EXPECT_EQ(t.body_json()["count"], ids.size());
  const Reply d = post(port(), "/detokenize", {{"tokens", ids}});
  ASSERT_EQ(d.status, 200);
  EXPECT_EQ(d.body_json()["content"], text);

  const json body = chat_body("Who begat Enos?", true, 4);
  const Reply a = post(port(), "/apply-template", body);
  ASSERT_EQ(a.status, 200) << a.body;
  const std::string prompt = a.body_json()["prompt"];
  EXPECT_NE(prompt.find("<|open|>message role=\"user\"<|sep|>Who begat Enos?<|close|>message"),
            std::string::npos)
      << prompt;
  EXPECT_TRUE(prompt.ends_with("<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"))
      << prompt;
  // /tokenize with messages counts the same prompt the completion is charged for.
  const Reply tm =
      post(port(), "/tokenize",
           {{"messages", body["messages"]}, {"chat_template_kwargs", {{"thinking", true}}}});
  ASSERT_EQ(tm.status, 200) << tm.body;
  const Reply c = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.body_json()["usage"]["prompt_tokens"], tm.body_json()["count"]);
  EXPECT_EQ(a.body_json()["tokens"], tm.body_json()["count"]);
}

TEST_F(Serve, ChatStreamEqualsNonStreamGreedyAndSeeded) {
  const char* prompts[] = {"And God said", "Who begat Enos?"};
  for (const char* p : prompts) {
    for (bool thinking : {false, true}) {
      for (int mode = 0; mode < 2; ++mode) {  // greedy, then seeded sampling
        SCOPED_TRACE(std::string(p) + (thinking ? " thinking" : "") + (mode ? " seeded" : ""));
        json body = chat_body(p, thinking, 24);
        if (mode == 1) {
          body["temperature"] = 1.0;
          body["top_p"] = 0.95;
          body["seed"] = 1234;
        }
        const Reply once = post(port(), "/v1/chat/completions", body);
        ASSERT_EQ(once.status, 200) << once.body;
        const json oj = once.body_json();
        EXPECT_EQ(oj["object"], "chat.completion");
        EXPECT_TRUE(std::string(oj["id"]).starts_with("chatcmpl-"));
        const ChatResult a = from_message(oj);
        json sb = body;
        sb["stream"] = true;
        sb["stream_options"] = {{"include_usage", true}};
        const ChatResult b = from_stream(post(port(), "/v1/chat/completions", sb));
        expect_same(a, b);
        EXPECT_EQ(a.usage["prompt_tokens"], b.usage["prompt_tokens"]);
        EXPECT_EQ(a.usage["completion_tokens"], b.usage["completion_tokens"]);
        EXPECT_EQ(a.usage["total_tokens"],
                  a.usage["prompt_tokens"].get<int>() + a.usage["completion_tokens"].get<int>());
        EXPECT_TRUE(a.usage["prompt_tokens_details"]["cached_tokens"].is_number());
        // Real model text: with thinking off everything is content; with it on, the trained
        // model (which never saw chat markup) writes text with no markers: reasoning.
        if (thinking) {
          EXPECT_TRUE(a.reasoning.is_string());
        } else {
          EXPECT_TRUE(a.content.is_string());
          EXPECT_TRUE(a.reasoning.is_null());
        }
      }
    }
  }
}

TEST_F(Serve, ReasoningTruncatedByMaxTokensIsReasoningWithNullContent) {
  json body = chat_body("And it came to pass", true, 6);
  const ChatResult a = from_message(post(port(), "/v1/chat/completions", body).body_json());
  EXPECT_TRUE(a.content.is_null());
  ASSERT_TRUE(a.reasoning.is_string());
  EXPECT_FALSE(a.reasoning.get<std::string>().empty());
  EXPECT_EQ(a.finish_reason, "length");
  EXPECT_EQ(a.usage["completion_tokens"], 6);
  body["stream"] = true;
  expect_same(a, from_stream(post(port(), "/v1/chat/completions", body)));
}

TEST_F(Serve, StopStringsEndContentAndAreNotShown) {
  const json base = chat_body("And God said", false, 40);
  const ChatResult full = from_message(post(port(), "/v1/chat/completions", base).body_json());
  ASSERT_TRUE(full.content.is_string());
  const std::string text = full.content;
  ASSERT_GT(text.size(), 20u) << text;
  // A stop string from the middle of the greedy text: the output is what came before it.
  const std::string stop = text.substr(text.size() / 2, 4);
  const std::string before = text.substr(0, text.find(stop));
  json body = base;
  body["stop"] = json::array({"zzzz-never", stop});
  const ChatResult a = from_message(post(port(), "/v1/chat/completions", body).body_json());
  EXPECT_EQ(a.content, before.empty() ? json(nullptr) : json(before));
  EXPECT_EQ(a.finish_reason, "stop");
  body["stream"] = true;
  expect_same(a, from_stream(post(port(), "/v1/chat/completions", body)));

  // Text completions: the engine's stop strings.
  json cb = {{"prompt", "And God said"}, {"max_tokens", 40}, {"temperature", 0}};
  const Reply fr = post(port(), "/v1/completions", cb);
  ASSERT_EQ(fr.status, 200) << fr.body;
  const std::string ctext = fr.body_json()["choices"][0]["text"];
  ASSERT_GT(ctext.size(), 20u);
  const std::string cstop = ctext.substr(ctext.size() / 2, 3);
  cb["stop"] = cstop;
  const Reply sr = post(port(), "/v1/completions", cb);
  EXPECT_EQ(sr.body_json()["choices"][0]["text"], ctext.substr(0, ctext.find(cstop)));
  EXPECT_EQ(sr.body_json()["choices"][0]["finish_reason"], "stop");
}

TEST_F(Serve, LogprobsOfEveryToken) {
  json body = chat_body("The LORD is my shepherd", false, 12);
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  const Reply r = post(port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.body_json();
  const json& lp = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(lp.size(), j["usage"]["completion_tokens"].get<size_t>());
  std::string joined;
  for (const json& e : lp) {
    ASSERT_EQ(e["top_logprobs"].size(), 3u);
    EXPECT_LE(e["logprob"].get<double>(), 0.0);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(e["token"], e["top_logprobs"][0]["token"]);
    EXPECT_DOUBLE_EQ(e["logprob"].get<double>(), e["top_logprobs"][0]["logprob"].get<double>());
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(),
              e["top_logprobs"][1]["logprob"].get<double>());
    EXPECT_TRUE(e["bytes"].is_array());
    joined += e["token"].get<std::string>();
  }
  EXPECT_TRUE(joined.starts_with(j["choices"][0]["message"]["content"].get<std::string>()));
  // Streamed, the entries are spread over the chunks and add up to the same list.
  body["stream"] = true;
  const Sse sse = parse_sse(post(port(), "/v1/chat/completions", body).body);
  json streamed = json::array();
  for (const std::string& d : sse.data) {
    if (d == "[DONE]") continue;
    const json c = json::parse(d);
    if (!c["choices"].empty() && c["choices"][0].contains("logprobs") &&
        !c["choices"][0]["logprobs"].is_null())
      for (const json& e : c["choices"][0]["logprobs"]["content"]) streamed.push_back(e);
  }
  EXPECT_EQ(streamed, lp);
}

TEST_F(Serve, CompletionsWithStringAndTokenIdsAgree) {
  const std::string text = "In the beginning God created";
  json body = {{"prompt", text}, {"max_tokens", 20}, {"temperature", 0}};
  const Reply a = post(port(), "/v1/completions", body);
  ASSERT_EQ(a.status, 200) << a.body;
  const json aj = a.body_json();
  EXPECT_EQ(aj["object"], "text_completion");
  EXPECT_EQ(aj["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(aj["usage"]["completion_tokens"], 20);
  const json ids = post(port(), "/tokenize", {{"content", text}}).body_json()["tokens"];
  body["prompt"] = ids;
  const Reply b = post(port(), "/v1/completions", body);
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(b.body_json()["choices"][0]["text"], aj["choices"][0]["text"]);
  EXPECT_EQ(b.body_json()["usage"]["prompt_tokens"], ids.size());
  // One prompt in a list is that prompt.
  body["prompt"] = json::array({text});
  EXPECT_EQ(post(port(), "/v1/completions", body).body_json()["choices"][0]["text"],
            aj["choices"][0]["text"]);
  // Streaming adds up to the same text; echo prepends the prompt.
  body["prompt"] = text;
  body["stream"] = true;
  const Sse sse = parse_sse(post(port(), "/v1/completions", body).body);
  std::string streamed;
  std::string finish;
  for (const std::string& d : sse.data) {
    if (d == "[DONE]") continue;
    const json c = json::parse(d);
    EXPECT_EQ(c["object"], "text_completion");
    streamed += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(streamed, aj["choices"][0]["text"]);
  EXPECT_EQ(finish, "length");
  body.erase("stream");
  body["echo"] = true;
  EXPECT_EQ(post(port(), "/v1/completions", body).body_json()["choices"][0]["text"],
            text + aj["choices"][0]["text"].get<std::string>());
  // Legacy logprobs: one entry per token, offsets into the text.
  body.erase("echo");
  body["logprobs"] = 2;
  const json lj = post(port(), "/v1/completions", body).body_json();
  const json& lp = lj["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 20u);
  EXPECT_EQ(lp["token_logprobs"].size(), 20u);
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  EXPECT_EQ(lp["text_offset"][0], 0);
}

TEST_F(Serve, GenerationThatReachesTheContextEndsWithLength) {
  // No max_tokens: generate up to the context (256 positions on kjv).
  json body = {
      {"prompt", "And the LORD spake unto Moses"}, {"temperature", 0}, {"ignore_eos", true}};
  body["max_tokens"] = nullptr;
  const Reply r = post(port(), "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = r.body_json();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  // /v1/completions defaults max_tokens to 16 only when absent, null means absent too.
  EXPECT_EQ(j["usage"]["completion_tokens"], 16);
  json chat = chat_body("And the LORD spake unto Moses", false, 1);
  chat.erase("max_tokens");
  chat["ignore_eos"] = true;
  const json cj = post(port(), "/v1/chat/completions", chat).body_json();
  EXPECT_EQ(cj["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(cj["usage"]["total_tokens"], 256);
}

TEST_F(Serve, PrefixReuseAcrossTurnsWithOutputEqualToNoReuse) {
  json body = chat_body("Who was the father of Enos?", false, 16);
  const json t1 = post(port(), "/v1/chat/completions", body).body_json();
  ASSERT_TRUE(t1.contains("choices")) << t1.dump();
  const int64_t p1 = t1["usage"]["prompt_tokens"];
  // Turn 2: the reply goes back as returned, then a new question.
  json msgs = body["messages"];
  msgs.push_back(t1["choices"][0]["message"]);
  msgs.push_back({{"role", "user"}, {"content", "And who was his son?"}});
  json b2 = body;
  b2["messages"] = msgs;
  const json t2 = post(port(), "/v1/chat/completions", b2).body_json();
  const int64_t cached = t2["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, p1) << "turn 2 should restore at least turn 1's prompt";
  EXPECT_LT(cached, t2["usage"]["prompt_tokens"].get<int64_t>());
  json nocache = b2;
  nocache["cache_prompt"] = false;
  const json t3 = post(port(), "/v1/chat/completions", nocache).body_json();
  EXPECT_EQ(t3["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(t3["choices"][0]["message"], t2["choices"][0]["message"]);
  EXPECT_GT(metric(port(), "attnres_prefix_cache_hits_total"), 0);
  EXPECT_GE(metric(port(), "attnres_prefix_cache_tokens_restored_total"), cached);
}

TEST_F(Serve, MetricsArePrometheusText) {
  const Reply r = get(port(), "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_TRUE(r.header("content-type").starts_with("text/plain"));
  std::istringstream in(r.body);
  std::string line;
  int samples = 0;
  while (std::getline(in, line)) {
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) continue;
    const size_t sp = line.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    EXPECT_TRUE(std::isfinite(std::stod(line.substr(sp + 1)))) << line;
    EXPECT_TRUE(line.rfind("attnres_", 0) == 0) << line;
    ++samples;
  }
  EXPECT_GT(samples, 20);
  for (const char* name : {"attnres_requests_running", "attnres_requests_waiting",
                           "attnres_prompt_tokens_total", "attnres_generation_tokens_total",
                           "attnres_prefix_cache_hits_total", "attnres_engine_step_seconds_total"})
    EXPECT_GE(metric(port(), name), 0) << name;
}

// Tool calls on the wire, with output tokens dictated by the request (--test-forced-output):
// the trained model never writes chat markup.
TEST(ServeForced, ToolCallsReasoningAndContentFromForcedOutput) {
  ServerOptions o = kjv_options();
  o.engine.allow_forced_tokens = true;
  TestServer s(o);
  const std::string forced =
      "<|open|>think<|sep|>Hm.<|close|>think<|sep|>"
      "<|open|>response<|sep|>Ok.<|close|>response<|sep|>"
      "<|open|>tools<|sep|><|open|>call tool=\"get_weather\"<|sep|>"
      "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris & \"Rome\" "
      "<b><|close|>argument<|sep|>"
      "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
      "<|close|>call<|sep|><|open|>call tool=\"noop\"<|sep|><|close|>call<|sep|>"
      "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
  // kjv's context is 256 positions: no tool declarations (the parser needs none) and no
  // thinking-effort message.
  json body = chat_body("Weather?", true, 200);
  body["chat_template_kwargs"]["thinking_effort"] = nullptr;
  body["attnres_forced_output"] = forced;
  const Reply r = post(s.port(), "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const ChatResult a = from_message(r.body_json());
  EXPECT_EQ(a.reasoning, "Hm.");
  EXPECT_EQ(a.content, "Ok.");
  // The output ended at the message's close: the stop token after it was never needed.
  EXPECT_LT(r.body_json()["usage"]["completion_tokens"].get<int>(), 200);
  EXPECT_EQ(a.finish_reason, "tool_calls");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(a.tool_calls[0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris & \"Rome\" <b>"}, {"days", 3}}));
  EXPECT_EQ(a.tool_calls[1]["function"]["arguments"], "{}");
  EXPECT_NE(a.tool_calls[0]["id"], a.tool_calls[1]["id"]);
  body["stream"] = true;
  const ChatResult b = from_stream(post(s.port(), "/v1/chat/completions", body));
  EXPECT_EQ(a.content, b.content);
  EXPECT_EQ(a.reasoning, b.reasoning);
  EXPECT_EQ(a.finish_reason, b.finish_reason);
  ASSERT_EQ(b.tool_calls.size(), 2u);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_EQ(a.tool_calls[i]["function"], b.tool_calls[i]["function"]);
  // The next turn sends a call and its result back: rendered, matched by tool_call_id (only the
  // short call: kjv's context is 256 positions).
  json msgs = body["messages"];
  json reply = r.body_json()["choices"][0]["message"];
  reply["tool_calls"] = json::array({reply["tool_calls"][1]});
  msgs.push_back(reply);
  msgs.push_back(
      {{"role", "tool"}, {"tool_call_id", reply["tool_calls"][0]["id"]}, {"content", "ok"}});
  json b2 = body;
  b2.erase("stream");
  b2["messages"] = msgs;
  b2["max_tokens"] = 20;
  b2["chat_template_kwargs"]["thinking"] = false;  // shorter history (256-position context)
  b2["attnres_forced_output"] = "Sunny.<|close|>response<|sep|><|end_of_msg|>";
  const Reply r2 = post(s.port(), "/v1/chat/completions", b2);
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(r2.body_json()["choices"][0]["message"]["content"], "Sunny.");
  EXPECT_EQ(r2.body_json()["choices"][0]["finish_reason"], "stop");
  const Reply tpl = post(s.port(), "/apply-template", b2);
  EXPECT_NE(tpl.body_json()["prompt"].get<std::string>().find(
                "<|open|>message role=\"tool\" tool=\"noop\""),
            std::string::npos)
      << tpl.body;
  // Forced output that ends the message by its close tag, without the stop token.
  json b3 = b2;
  b3["attnres_forced_output"] = "Done.<|close|>message<|sep|>";
  const json j3 = post(s.port(), "/v1/chat/completions", b3).body_json();
  EXPECT_EQ(j3["choices"][0]["message"]["content"], "Done.");
  EXPECT_EQ(j3["choices"][0]["finish_reason"], "stop");
  EXPECT_LE(metric(s.port(), "attnres_cancel_max_steps_after"), 1);
}

// Opens a stream and reads until `n` data events arrived; returns the client (still open).
std::unique_ptr<Client> open_stream(int port, const json& body, int n) {
  auto c = std::make_unique<Client>(port);
  EXPECT_TRUE(c->send_raw(request("POST", "/v1/chat/completions", body.dump())));
  for (int i = 0; i < 2000; ++i) {
    const Reply r = c->parse();
    if (r.status != 0) {
      EXPECT_EQ(r.status, 200) << r.body;
    }
    if (static_cast<int>(parse_sse(r.body).data.size()) >= n) break;
    if (!c->read_more(5000)) break;
  }
  return c;
}

json long_body(const std::string& prompt, int max_tokens) {
  json b = chat_body(prompt, false, max_tokens);
  b["ignore_eos"] = true;
  b["stream"] = true;
  return b;
}

TEST(ServeScheduling, DisconnectCancelsWithinOneStepAndFreesTheSlot) {
  ServerOptions o = kjv_options();
  o.engine.max_sequences = 1;
  TestServer s(o);
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE(round);
    auto c = open_stream(s.port(), long_body("And God said", 200), 3 + round);
    c->close_now();
    ASSERT_TRUE(eventually([&] { return metric(s.port(), "attnres_cancels_total") == round + 1; }));
  }
  EXPECT_TRUE(eventually([&] { return metric(s.port(), "attnres_cancels_total") == 5; }));
  // Between the cancel reaching the loop and the request ending, at most the step already
  // running did work for it.
  EXPECT_LE(metric(s.port(), "attnres_cancel_max_steps_after"), 1);
  EXPECT_EQ(metric(s.port(), "attnres_client_aborts_total"), 5);
  // Each cancelled run stopped long before its 200 tokens.
  EXPECT_LT(metric(s.port(), "attnres_generation_tokens_total"), 5 * 100);
  // The slot is free: a new request runs to its end.
  const Reply r = post(s.port(), "/v1/chat/completions", chat_body("Jesus wept", false, 5));
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST(ServeScheduling, DisconnectDuringPrefillCancelsIt) {
  ServerOptions o = kjv_options();
  o.engine.max_sequences = 1;
  o.engine.prefill_chunk = 1;  // one prompt position per step: a long, silent prefill
  o.ping_interval_ms = 5;
  o.test_step_delay_ms = 5;
  TestServer s(o);
  std::string prompt;
  for (int i = 0; i < 30; ++i) prompt += "and the LORD said ";
  auto c = std::make_unique<Client>(s.port());
  ASSERT_TRUE(c->send_raw(request("POST", "/v1/chat/completions", long_body(prompt, 10).dump())));
  // The first ping says the request is prefilling.
  for (int i = 0; i < 1000 && parse_sse(c->parse().body).comments == 0; ++i) c->read_more(5000);
  ASSERT_GE(parse_sse(c->parse().body).comments, 1) << c->raw();
  c->close_now();
  ASSERT_TRUE(eventually([&] { return metric(s.port(), "attnres_cancels_total") == 1; }));
  EXPECT_EQ(metric(s.port(), "attnres_generation_tokens_total"), 0);
  EXPECT_LE(metric(s.port(), "attnres_cancel_max_steps_after"), 1);
  const double prefilled = metric(s.port(), "attnres_prefill_tokens_total");
  const double prompt_tokens = metric(s.port(), "attnres_prompt_tokens_total");
  EXPECT_LT(prefilled, prompt_tokens);
  EXPECT_GT(prefilled, 0) << get(s.port(), "/metrics").body;
}

TEST(ServeScheduling, CancellingAQueuedRequestLeavesTheRunningOneUntouched) {
  ServerOptions o = kjv_options();
  o.engine.max_sequences = 1;
  o.engine.prefix_cache_bytes = 0;
  o.test_step_delay_ms = 10;
  TestServer s(o);
  json a = chat_body("The LORD is my shepherd", false, 120);
  a["ignore_eos"] = true;
  const ChatResult alone = from_message(post(s.port(), "/v1/chat/completions", a).body_json());
  auto fut = std::async(std::launch::async, [&] {
    return from_message(post(s.port(), "/v1/chat/completions", a).body_json());
  });
  ASSERT_TRUE(eventually([&] { return metric(s.port(), "attnres_requests_running") == 1; }));
  // B waits (one running slot); its client leaves.
  auto b = std::make_unique<Client>(s.port());
  ASSERT_TRUE(
      b->send_raw(request("POST", "/v1/chat/completions", long_body("And God said", 50).dump())));
  ASSERT_TRUE(eventually([&] { return metric(s.port(), "attnres_requests_waiting") == 1; }));
  b->close_now();
  ASSERT_TRUE(eventually([&] { return metric(s.port(), "attnres_requests_waiting") == 0; }));
  const ChatResult together = fut.get();
  expect_same(alone, together);
  EXPECT_EQ(metric(s.port(), "attnres_client_aborts_total"), 1);
}

TEST(ServeScheduling, BeyondTheQueueIs503WithRetryAfter) {
  ServerOptions o = kjv_options();
  o.engine.max_sequences = 1;
  o.queue = 1;
  o.test_step_delay_ms = 20;  // A runs for seconds
  TestServer s(o);
  auto a = open_stream(s.port(), long_body("And God said", 200), 2);
  auto b = std::make_unique<Client>(s.port());
  ASSERT_TRUE(
      b->send_raw(request("POST", "/v1/chat/completions", long_body("And God said", 10).dump())));
  ASSERT_TRUE(eventually([&] { return metric(s.port(), "attnres_requests_waiting") == 1; }));
  const Reply r = post(s.port(), "/v1/chat/completions", chat_body("Jesus wept", false, 3));
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.header("retry-after"), "1");
  EXPECT_EQ(r.body_json()["error"]["code"], "server_busy");
  EXPECT_GE(metric(s.port(), "attnres_requests_rejected_total{reason=\"full\"}"), 0);
  // /health answers at once while the slot and the queue are full.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(get(s.port(), "/health").status, 200);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.1);
}

TEST(ServeStream, PingsWhileAPrefillIsSilent) {
  ServerOptions o = kjv_options();
  o.engine.prefill_chunk = 1;
  o.ping_interval_ms = 2;
  TestServer s(o);
  std::string prompt;
  for (int i = 0; i < 20; ++i) prompt += "and the LORD said ";
  json body = long_body(prompt, 4);
  const Reply r = post(s.port(), "/v1/chat/completions", body);
  const Sse sse = parse_sse(r.body);
  EXPECT_GE(sse.comments_before_data, 1) << r.body.substr(0, 200);
  ASSERT_FALSE(sse.data.empty());
  EXPECT_EQ(sse.data.back(), "[DONE]");
  EXPECT_EQ(from_stream(r).finish_reason, "length");
}

TEST(ServeLifecycle, HealthIs503WhileLoadingThen200) {
  ServerOptions o = kjv_options();
  o.test_load_delay_ms = 800;
  TestServer s(o, /*load=*/false);
  std::thread loader([&] { EXPECT_TRUE(s.server->load().is_ok()); });
  const Reply h = get(s.port(), "/health");
  EXPECT_EQ(h.status, 503);
  EXPECT_EQ(h.body_json()["status"], "loading");
  const Reply c = post(s.port(), "/v1/chat/completions", chat_body("Jesus wept", false, 2));
  EXPECT_EQ(c.status, 503);
  EXPECT_EQ(c.body_json()["error"]["code"], "loading");
  loader.join();
  EXPECT_EQ(get(s.port(), "/health").status, 200);
  EXPECT_EQ(get(s.port(), "/health").body_json()["status"], "ok");
}

TEST(ServeLifecycle, StopEndsRunningStreamsWithAnErrorEvent) {
  ServerOptions o = kjv_options();
  o.engine.max_sequences = 2;
  o.test_step_delay_ms = 20;
  auto s = std::make_unique<TestServer>(o);
  auto a = open_stream(s->port(), long_body("And God said", 200), 2);
  auto b = open_stream(s->port(), long_body("The LORD is my shepherd", 190), 2);
  const auto t0 = std::chrono::steady_clock::now();
  s->server->stop();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  for (Client* c : {a.get(), b.get()}) {
    const Reply r = c->read_reply(10000);
    const Sse sse = parse_sse(r.body);
    ASSERT_FALSE(sse.data.empty());
    EXPECT_NE(sse.data.back(), "[DONE]");
    const json last = json::parse(sse.data.back(), nullptr, false);
    ASSERT_TRUE(last.contains("error")) << sse.data.back();
    EXPECT_EQ(last["error"]["code"], "shutdown");
    EXPECT_TRUE(r.complete) << "the chunked body is terminated";
  }
  s.reset();
}

}  // namespace
}  // namespace attnres::server::test
