// attnres generate / attnres chat: text in, streamed text out, with the model's own tokenizer
// and chat format.
//   generate --model DIR --prompt TEXT [--chat [--thinking on|off]] [sampling flags]
//            [--max-new-tokens N] [--json]
//   chat --model DIR [--thinking on|off] [--system TEXT] [sampling flags]
// generate streams the decoded text to stdout as tokens arrive and prints tokens/s to stderr
// (--json: one summary object on stdout instead). chat is an interactive terminal chat: each
// turn renders the whole conversation, and the engine's prefix store restores the state the
// previous turn left (only new tokens are prefilled); /reset clears the history, /exit or end of
// input quits, and Ctrl-C stops a generation (or a long prefill, after its current chunk)
// without ending the session.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "attnres/chat.h"
#include "command.h"
#include "frontend.h"

namespace attnres::cli {
namespace {

std::atomic<bool> g_cancel{false};
std::atomic<bool> g_generating{false};

extern "C" void on_sigint(int) {
  if (g_generating.load()) {
    g_cancel.store(true);
  } else {
    static const char kHint[] = "\n(type /exit or press Ctrl-D to quit)\n> ";
    ssize_t ignored = write(STDOUT_FILENO, kHint, sizeof kHint - 1);
    (void)ignored;
  }
}

void install_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
}

Result<bool> parse_thinking(const std::string& s) {
  if (s == "on") return true;
  if (s == "off") return false;
  return Status(ErrorCode::kInvalidArgument, "--thinking is '" + s + "', expected on or off");
}

void print_stream(std::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

double decode_tokens_per_second(const GenerationResult& r) {
  return r.decode_seconds > 0 && r.tokens.size() > 1
             ? static_cast<double>(r.tokens.size() - 1) / r.decode_seconds
             : 0.0;
}

nlohmann::ordered_json chat_body(const nlohmann::ordered_json& messages, bool thinking) {
  return {{"messages", messages}, {"chat_template_kwargs", {{"thinking", thinking}}}};
}

struct GenerateArgs {
  ModelArgs model;
  SamplingArgs sampling;
  std::string prompt;
  bool chat = false;
  std::string thinking = "on";
  bool json = false;
};

int run_generate(const GenerateArgs& a) {
  auto thinking = parse_thinking(a.thinking);
  if (!thinking) return fail(thinking.status().to_string());
  auto eo = engine_options(a.model);
  if (!eo) return fail(eo.status().to_string());
  auto model = load_cli_model(a.model, /*need_tokenizer=*/true, /*progress=*/!a.json);
  if (!model) return fail(model.status().to_string());
  GenerationRequest req = sampling_request(a.sampling);
  if (a.chat) {
    const nlohmann::ordered_json msgs = {{{"role", "user"}, {"content", a.prompt}}};
    auto p = apply_chat_template(**model, chat_body(msgs, *thinking));
    if (!p) return fail(p.status().to_string());
    req.prompt = std::move(p->tokens);
  } else {
    auto ids = (*model)->encode(a.prompt);
    if (!ids) return fail(ids.status().to_string());
    req.prompt = std::move(ids).value();
  }
  eo->max_sequences = 1;
  auto engine = Engine::create(*model, *eo);
  if (!engine) return fail(engine.status().to_string());
  auto on_text = [&](std::string_view t) {
    if (!a.json) print_stream(t);
  };
  auto r = run_request(**engine, std::move(req), on_text, nullptr, !a.json);
  if (!r) return fail(r.status().to_string());
  const double tps = decode_tokens_per_second(*r);
  if (a.json) {
    std::cout << nlohmann::json{{"text", r->text},
                                {"tokens", r->tokens},
                                {"prompt_tokens", r->prompt_tokens},
                                {"generated_tokens", r->tokens.size()},
                                {"stop_reason", stop_reason_name(r->reason)},
                                {"prefill_seconds", r->ttft_seconds},
                                {"decode_seconds", r->decode_seconds},
                                {"decode_tokens_per_second", tps}}
                     .dump()
              << "\n";
  } else {
    std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "[%lld prompt tokens, %zu generated, %.2f tok/s, stop: %s]\n",
                 static_cast<long long>(r->prompt_tokens), r->tokens.size(), tps,
                 std::string(stop_reason_name(r->reason)).c_str());
  }
  return 0;
}

struct ChatArgs {
  ModelArgs model;
  SamplingArgs sampling;
  std::string thinking = "on";
  std::string system;
  int64_t prefix_cache_mb = 1024;
};

// The assistant message of a reply as the next turn's history renders it: its reasoning,
// content and tool calls (clients must send these back for the prompt prefix to match).
nlohmann::ordered_json reply_message(const Model& model, const GenerationResult& r, bool thinking) {
  ChatOutput out(model, thinking, "call_");
  for (int32_t t : r.tokens) (void)out.push(t);
  out.finish(r.reason == FinishReason::kStopToken ? ChatOutputEnd::kEndOfMessage
                                                  : ChatOutputEnd::kTruncated);
  const ChatParsed p = out.message();
  nlohmann::ordered_json m = {{"role", "assistant"}, {"content", p.content.value_or("")}};
  if (p.reasoning_content) m["reasoning_content"] = *p.reasoning_content;
  if (!p.tool_calls.empty()) {
    m["tool_calls"] = nlohmann::ordered_json::array();
    for (const ChatParsedToolCall& c : p.tool_calls)
      m["tool_calls"].push_back({{"id", c.id},
                                 {"type", "function"},
                                 {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return m;
}

int run_chat(const ChatArgs& a) {
  auto thinking = parse_thinking(a.thinking);
  if (!thinking) return fail(thinking.status().to_string());
  auto eo = engine_options(a.model);
  if (!eo) return fail(eo.status().to_string());
  if (a.prefix_cache_mb < 0) return fail("--prefix-cache-mb must not be negative");
  auto model = load_cli_model(a.model, /*need_tokenizer=*/true, /*progress=*/true);
  if (!model) return fail(model.status().to_string());
  eo->max_sequences = 1;
  eo->prefix_cache_bytes = a.prefix_cache_mb << 20;
  auto engine = Engine::create(*model, *eo);
  if (!engine) return fail(engine.status().to_string());
  install_sigint();
  const bool interactive = isatty(STDIN_FILENO) == 1;
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  if (interactive)
    std::printf("attnres chat (%s). /reset clears the history, /exit quits.\n",
                a.model.model.c_str());
  std::string line;
  while (true) {
    if (interactive) {
      std::printf("> ");
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages.erase(messages.begin() + (a.system.empty() ? 0 : 1), messages.end());
      std::printf("(history cleared)\n");
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    auto prompt = apply_chat_template(**model, chat_body(messages, *thinking));
    if (!prompt) return fail(prompt.status().to_string());
    GenerationRequest req = sampling_request(a.sampling);
    req.prompt = std::move(prompt->tokens);
    req.snapshot_at_end = true;
    g_cancel = false;
    g_generating = true;
    auto r = run_request(**engine, std::move(req), print_stream, &g_cancel);
    g_generating = false;
    if (!r) {
      // A turn that cannot run (e.g. the context is full) leaves the session usable.
      std::fprintf(stderr, "error: %s\n", r.status().to_string().c_str());
      messages.erase(messages.end() - 1);
      continue;
    }
    std::printf("\n");
    if (r->reason == FinishReason::kCancelled) std::printf("(stopped)\n");
    messages.push_back(reply_message(**model, *r, *thinking));
    if (interactive)
      std::fprintf(stderr, "[%zu tokens, %.2f tok/s, %lld of %lld prompt tokens reused]\n",
                   r->tokens.size(), decode_tokens_per_second(*r),
                   static_cast<long long>(r->cached_tokens),
                   static_cast<long long>(r->prompt_tokens));
  }
  if (interactive) std::printf("\n");
  return 0;
}

const CommandRegistration kGenerate(
    "generate", "Generate text from a prompt, streaming it as it is produced", [](CLI::App* sub) {
      auto a = std::make_shared<GenerateArgs>();
      add_model_options(sub, a->model);
      add_sampling_options(sub, a->sampling);
      sub->add_option("--prompt", a->prompt, "Prompt text")->required();
      sub->add_flag("--chat", a->chat, "Wrap the prompt as a user message in the chat format");
      sub->add_option("--thinking", a->thinking, "With --chat: on (default) or off");
      sub->add_flag("--json", a->json, "Print one JSON summary instead of streaming");
      return CommandRun([a] { return run_generate(*a); });
    });

const CommandRegistration kChat(
    "chat", "Interactive chat in the model's chat format", [](CLI::App* sub) {
      auto a = std::make_shared<ChatArgs>();
      add_model_options(sub, a->model);
      add_sampling_options(sub, a->sampling);
      sub->add_option("--thinking", a->thinking, "Thinking on (default) or off");
      sub->add_option("--system", a->system, "System message");
      sub->add_option("--prefix-cache-mb", a->prefix_cache_mb,
                      "Memory for the states kept between turns (default 1024 MiB)");
      return CommandRun([a] { return run_chat(*a); });
    });

}  // namespace
}  // namespace attnres::cli
