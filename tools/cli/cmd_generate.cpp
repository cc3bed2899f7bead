// attnres generate / attnres chat: text in, streamed text out, with the model's own tokenizer
// and chat format.
//   generate --model DIR --prompt TEXT [--chat [--thinking on|off]] [sampling flags]
//            [--max-new-tokens N] [--json]
//   chat --model DIR [--thinking on|off] [--system TEXT] [sampling flags]
// generate streams the decoded text to stdout as tokens arrive and prints tokens/s to stderr
// (--json: one summary object on stdout instead). chat is an interactive terminal chat: the
// history stays in the session (only new tokens are prefilled each turn), /reset clears it,
// /exit or end of input quits, and Ctrl-C stops a generation without ending the session.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "textgen.h"
#include "tokenizer/chat.h"

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

struct GenerateArgs {
  TextModelArgs model;
  std::string prompt;
  bool chat = false;
  std::string thinking = "on";
  bool json = false;
};

int run_generate(GenerateArgs& a) {
  auto thinking = parse_thinking(a.thinking);
  if (!thinking) return fail(thinking.status().to_string());
  a.model.progress = !a.json;
  auto tm = load_text_model(a.model);
  if (!tm) return fail(tm.status().to_string());
  std::vector<int32_t> prompt;
  if (a.chat) {
    const ChatMessage msg = chat_message(ChatRole::kUser, a.prompt);
    auto ids = encode_chat(*tm->tokenizer, std::span(&msg, 1), {*thinking, true});
    if (!ids) return fail(ids.status().to_string());
    prompt = std::move(ids).value();
  } else {
    auto ids = tm->tokenizer->encode(a.prompt, /*allow_special=*/false);
    if (!ids) return fail(ids.status().to_string());
    prompt = std::move(ids).value();
  }
  std::vector<int32_t> history;
  auto on_text = [&](std::string_view t) {
    if (!a.json) print_stream(t);
  };
  auto r = generate_text(*tm->session, *tm->tokenizer, tm->weights->config, prompt, history,
                         tm->options, on_text);
  if (!r) return fail(r.status().to_string());
  const double tps =
      r->decode_seconds > 0 ? static_cast<double>(r->tokens.size()) / r->decode_seconds : 0.0;
  if (a.json) {
    std::cout << nlohmann::json{{"text", r->text},
                                {"tokens", r->tokens},
                                {"prompt_tokens", r->prompt_tokens},
                                {"generated_tokens", r->tokens.size()},
                                {"stop_reason", r->stop_reason},
                                {"prefill_seconds", r->prefill_seconds},
                                {"decode_seconds", r->decode_seconds},
                                {"decode_tokens_per_second", tps}}
                     .dump()
              << "\n";
  } else {
    std::printf("\n");
    std::fprintf(stderr, "[%lld prompt tokens, %zu generated, %.2f tok/s, stop: %s]\n",
                 static_cast<long long>(r->prompt_tokens), r->tokens.size(), tps,
                 r->stop_reason.c_str());
  }
  return 0;
}

struct ChatArgs {
  TextModelArgs model;
  std::string thinking = "on";
  std::string system;
};

// Splits a thinking-on reply into (reasoning, response) at the response marker.
void split_reply(const std::string& text, ChatMessage& msg) {
  const std::string close_think = "<|close|>think<|sep|>";
  const std::string open_response = "<|open|>response<|sep|>";
  const size_t r = text.find(open_response);
  if (r == std::string::npos) {
    msg.content = text;
    return;
  }
  std::string reasoning = text.substr(0, r);
  if (size_t c = reasoning.rfind(close_think); c != std::string::npos) reasoning.resize(c);
  msg.reasoning = reasoning;
  msg.content = text.substr(r + open_response.size());
  const std::string close_response = "<|close|>response<|sep|>";
  if (size_t c = msg.content.find(close_response); c != std::string::npos) msg.content.resize(c);
}

int run_chat(ChatArgs& a) {
  auto thinking = parse_thinking(a.thinking);
  if (!thinking) return fail(thinking.status().to_string());
  auto tm = load_text_model(a.model);
  if (!tm) return fail(tm.status().to_string());
  install_sigint();
  const bool interactive = isatty(STDIN_FILENO) == 1;
  std::vector<ChatMessage> messages;
  if (!a.system.empty()) messages.push_back(chat_message(ChatRole::kSystem, a.system));
  std::vector<int32_t> fed;  // tokens the session holds, in order
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
      messages.resize(a.system.empty() ? 0 : 1);
      fed.clear();
      tm->session->reset();
      std::printf("(history cleared)\n");
      continue;
    }
    if (line.empty()) continue;
    messages.push_back(chat_message(ChatRole::kUser, line));
    auto full = encode_chat(*tm->tokenizer, messages, {*thinking, true});
    if (!full) return fail(full.status().to_string());
    // Prefill only what the session does not hold yet; start over if the history diverged.
    std::span<const int32_t> todo(*full);
    if (full->size() > fed.size() && std::equal(fed.begin(), fed.end(), full->begin())) {
      todo = todo.subspan(fed.size());
    } else {
      tm->session->reset();
      fed.clear();
    }
    g_cancel = false;
    g_generating = true;
    auto r = generate_text(*tm->session, *tm->tokenizer, tm->weights->config, todo, fed,
                           tm->options, print_stream, &g_cancel);
    g_generating = false;
    if (!r) {
      // A turn that cannot run (e.g. the context is full) leaves the session usable.
      std::fprintf(stderr, "error: %s\n", r.status().to_string().c_str());
      messages.pop_back();
      tm->session->reset();
      fed.clear();
      continue;
    }
    std::printf("\n");
    if (r->stop_reason == "cancelled") std::printf("(stopped)\n");
    ChatMessage reply = chat_message(ChatRole::kAssistant, "");
    split_reply(r->text, reply);
    messages.push_back(std::move(reply));
    const double tps =
        r->decode_seconds > 0 ? static_cast<double>(r->tokens.size()) / r->decode_seconds : 0.0;
    if (interactive) std::fprintf(stderr, "[%zu tokens, %.2f tok/s]\n", r->tokens.size(), tps);
  }
  if (interactive) std::printf("\n");
  return 0;
}

const CommandRegistration kGenerate(
    "generate", "Generate text from a prompt, streaming it as it is produced", [](CLI::App* sub) {
      auto a = std::make_shared<GenerateArgs>();
      add_text_model_options(sub, a->model);
      sub->add_option("--prompt", a->prompt, "Prompt text")->required();
      sub->add_flag("--chat", a->chat, "Wrap the prompt as a user message in the chat format");
      sub->add_option("--thinking", a->thinking, "With --chat: on (default) or off");
      sub->add_flag("--json", a->json, "Print one JSON summary instead of streaming");
      return CommandRun([a] { return run_generate(*a); });
    });

const CommandRegistration kChat("chat", "Interactive chat in the model's chat format",
                                [](CLI::App* sub) {
                                  auto a = std::make_shared<ChatArgs>();
                                  add_text_model_options(sub, a->model);
                                  sub->add_option("--thinking", a->thinking,
                                                  "Thinking on (default) or off");
                                  sub->add_option("--system", a->system, "System message");
                                  return CommandRun([a] { return run_chat(*a); });
                                });

}  // namespace
}  // namespace attnres::cli
