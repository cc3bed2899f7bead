// attnres perplexity: mean negative log-likelihood and perplexity of a model over a text file.
//   perplexity --model DIR --text FILE [--tokenizer PATH] [--dtype f32|bf16]
//              [--kv-dtype auto|bf16|fp8|f32] [--chunk-size C] [--window N] [--json] [--quiet]
// The text is encoded with the model's tokenizer (Kimi pre-tokenizer, control-token names
// encoded as plain text) and scored in consecutive windows of N tokens, each from an empty
// state (N = the config's max_position_embeddings, the context the model was trained for; 0 or
// no such field: the whole text as one context). In a window every token after the first is
// scored by the logits of the row before it: NLL = logsumexp(row) - row[target], computed in
// double. Each window is one scoring request to the engine (its prompt, nothing generated),
// prefilled in chunks of C tokens, so
// --chunk-size 1 scores through the decode path, 64 and 4096 through chunked prefill.
// Output: mean NLL (nats / token), perplexity = exp(mean NLL), top-1 accuracy and the counts
// (one JSON object with --json); a progress line on stderr for texts over 4096 tokens unless
// --quiet. Errors (missing or empty text, bad flag values, a tokenizer larger than the model's
// vocabulary) name the file or flag and exit with status 1 (CLI11 flag checks: their own code).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "frontend.h"

namespace attnres::cli {
namespace {

constexpr int64_t kProgressMinTokens = 4096;

struct PerplexityArgs {
  std::string model;
  std::string text;
  std::string tokenizer;  // default MODEL/tiktoken.model
  std::string dtype = "bf16";
  std::string kv_dtype = "auto";
  int64_t chunk_size = 4096;
  int64_t window = -1;  // -1: the config's max_position_embeddings (or whole text)
  int threads = 0;
  bool mmap = false;
  bool json = false;
  bool quiet = false;
};

// Sum of NLL (double) and argmax hits over the rows [0, n) of `logits` ([n, V]) whose
// targets are targets[0, n).
struct Score {
  double nll = 0;
  int64_t scored = 0, top1 = 0;
};

void score_rows(const std::vector<float>& logits, int64_t V, const int32_t* targets, int64_t n,
                Score& s) {
  for (int64_t r = 0; r < n; ++r) {
    const float* row = logits.data() + r * V;
    int64_t best = 0;
    double mx = row[0];
    for (int64_t v = 1; v < V; ++v)
      if (row[v] > mx) {
        mx = row[v];
        best = v;
      }
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
    const double lse = mx + std::log(sum);
    s.nll += lse - static_cast<double>(row[targets[r]]);
    s.top1 += best == targets[r] ? 1 : 0;
    ++s.scored;
  }
}

// On a terminal one line rewritten at most once a second; otherwise a line at every tenth of
// the text (logs stay short). The last call prints the final line.
class Progress {
 public:
  Progress(int64_t total, bool show) : total_(total), show_(show), tty_(isatty(STDERR_FILENO)) {}
  void update(int64_t done, const Score& s, bool last = false) {
    if (!show_ || finished_ || (!last && done >= total_)) return;  // the last call shows 100%
    const auto now = std::chrono::steady_clock::now();
    const int64_t tenth = 10 * done / total_;
    if (!last && (tty_ ? now - shown_ < std::chrono::seconds(1) : tenth == tenth_shown_)) return;
    shown_ = now;
    tenth_shown_ = tenth;
    finished_ = last;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double ppl = s.scored > 0 ? std::exp(s.nll / static_cast<double>(s.scored)) : 0.0;
    std::fprintf(stderr,
                 "%sperplexity: %lld / %lld tokens (%.0f%%), running perplexity %.3f, %.0f tok/s%s",
                 tty_ ? "\r" : "", static_cast<long long>(done), static_cast<long long>(total_),
                 100.0 * static_cast<double>(done) / static_cast<double>(total_), ppl,
                 secs > 0 ? static_cast<double>(done) / secs : 0.0, tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  int64_t total_;
  bool show_, tty_;
  bool finished_ = false;
  int64_t tenth_shown_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point shown_{};
};

int run(const PerplexityArgs& a) {
  std::ifstream in(a.text, std::ios::binary);
  if (!in) return fail(a.text + ": cannot open text file");
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return fail(a.text + ": error reading text file");
  const std::string text = ss.str();
  if (text.empty()) return fail(a.text + ": the text file is empty (nothing to score)");
  if (a.window < -1 || a.window == 1)
    return fail("--window is " + std::to_string(a.window) +
                ", expected 0 (whole text) or at least 2 tokens");

  ModelArgs ma;
  ma.model = a.model;
  ma.tokenizer = a.tokenizer;
  ma.dtype = a.dtype;
  ma.kv_dtype = a.kv_dtype;
  ma.threads = a.threads;
  ma.mmap = a.mmap;
  auto eo = engine_options(ma);
  if (!eo) return fail(eo.status().to_string());
  eo->max_sequences = 1;
  eo->prefill_chunk = a.chunk_size;
  auto model = load_cli_model(ma, /*need_tokenizer=*/true, /*progress=*/!a.quiet && !a.json);
  if (!model) return fail(model.status().to_string());
  const int64_t V = (*model)->info().vocab_size;
  auto encoded = (*model)->encode(text);
  if (!encoded) return fail(encoded.status().to_string());
  const std::vector<int32_t> ids = std::move(encoded).value();
  if (ids.size() < 2)
    return fail(a.text + ": the text encodes to " + std::to_string(ids.size()) +
                " token(s); perplexity needs at least 2");
  const int64_t n = static_cast<int64_t>(ids.size());
  int64_t window = a.window;
  if (window < 0) window = (*model)->info().context_length;
  if (window == 0 || window > n) window = n;
  auto engine = Engine::create(*model, *eo);
  if (!engine) return fail(engine.status().to_string());

  Score score;
  Progress progress(n, !a.quiet && n > kProgressMinTokens);
  int64_t windows = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t w0 = 0; w0 < n; w0 += window) {
    const int64_t w1 = std::min(n, w0 + window);
    if (w1 - w0 < 2) break;  // a trailing single token has nothing before it to score it
    ++windows;
    // A scoring request: the window as the prompt, every row's logits, nothing generated.
    GenerationRequest req;
    req.prompt.assign(ids.begin() + w0, ids.begin() + w1);
    req.max_new_tokens = 0;
    req.keep_logits = true;
    GenerationResult res;
    GenerationCallbacks cb;
    cb.on_finish = [&](GenerationResult&& r) { res = std::move(r); };
    cb.on_prefill = [&](int64_t done, int64_t) { progress.update(w0 + done, score); };
    if (auto id = (*engine)->submit(std::move(req), std::move(cb)); !id)
      return fail(id.status().to_string());
    if (Status st = (*engine)->run(); !st) return fail(st.to_string());
    if (res.reason == FinishReason::kError) return fail(res.error.to_string());
    // Row r predicts token w0 + r + 1; the window's last token predicts nothing inside it.
    score_rows(res.prompt_logits, V, ids.data() + w0 + 1, w1 - w0 - 1, score);
  }
  progress.update(n, score, /*last=*/true);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double mean = score.nll / static_cast<double>(score.scored);
  const double ppl = std::exp(mean);
  const double acc = static_cast<double>(score.top1) / static_cast<double>(score.scored);
  const std::string kv = a.kv_dtype != "auto" ? a.kv_dtype : a.dtype == "f32" ? "f32" : "bf16";
  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model;
    j["text"] = a.text;
    j["text_bytes"] = text.size();
    j["tokens"] = n;
    j["scored_tokens"] = score.scored;
    j["window"] = window;
    j["windows"] = windows;
    j["dtype"] = a.dtype;
    j["kv_dtype"] = kv;
    j["chunk_size"] = a.chunk_size;
    j["mean_nll"] = mean;
    j["perplexity"] = ppl;
    j["top1_accuracy"] = acc;
    j["seconds"] = secs;
    j["tokens_per_second"] = static_cast<double>(n) / secs;
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%s: %zu bytes, %lld tokens in %lld window(s) of up to %lld, %lld scored\n",
                a.text.c_str(), text.size(), static_cast<long long>(n),
                static_cast<long long>(windows), static_cast<long long>(window),
                static_cast<long long>(score.scored));
    std::printf("model %s, dtype %s, kv %s, chunk %lld\n", a.model.c_str(), a.dtype.c_str(),
                kv.c_str(), static_cast<long long>(a.chunk_size));
    std::printf("mean NLL %.6f nats/token, perplexity %.4f, top-1 accuracy %.4f\n", mean, ppl, acc);
    std::fprintf(stderr, "scored in %.2f s (%.0f tok/s)\n", secs, static_cast<double>(n) / secs);
  }
  return 0;
}

const CommandRegistration kReg(
    "perplexity", "mean negative log-likelihood and perplexity of a model over a text file",
    [](CLI::App* sub) -> CommandRun {
      auto a = std::make_shared<PerplexityArgs>();
      sub->add_option("--model", a->model, "model directory (config.json + safetensors)")
          ->required();
      sub->add_option("--text", a->text, "UTF-8 text file to score")->required();
      sub->add_option("--tokenizer", a->tokenizer,
                      "tiktoken.model (default: MODEL/tiktoken.model)");
      sub->add_option("--dtype", a->dtype, "activation dtype")
          ->capture_default_str()
          ->check(CLI::IsMember({"bf16", "f32"}));
      sub->add_option("--kv-dtype", a->kv_dtype,
                      "MLA latent cache dtype (auto = f32 with --dtype f32, else bf16)")
          ->capture_default_str()
          ->check(CLI::IsMember({"auto", "bf16", "fp8", "f32"}));
      sub->add_option("--chunk-size", a->chunk_size, "tokens per forward step (prefill chunk)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
      sub->add_option("--window", a->window,
                      "tokens per context window, each from an empty state (default: the "
                      "config's max_position_embeddings; 0: the whole text)");
      sub->add_option("--threads", a->threads,
                      "Threads (default: the physical cores this process may run on)");
      add_mmap_flag(sub, a->mmap);
      sub->add_flag("--json", a->json, "print one JSON object");
      sub->add_flag("--quiet", a->quiet, "no progress line on stderr");
      return [a] { return run(*a); };
    });

}  // namespace
}  // namespace attnres::cli
