#include "frontend.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "util/memory.h"

namespace attnres::cli {

bool stderr_is_terminal() {
  return isatty(STDERR_FILENO) == 1;
}

namespace {

std::map<const CLI::App*, const ModelArgs*>& model_args_registry() {
  static std::map<const CLI::App*, const ModelArgs*> r;
  return r;
}

}  // namespace

const ModelArgs* model_args_of(const CLI::App* sub) {
  const auto& r = model_args_registry();
  auto it = r.find(sub);
  return it == r.end() ? nullptr : it->second;
}

void add_model_options(CLI::App* sub, ModelArgs& a) {
  model_args_registry()[sub] = &a;
  sub->add_option("--model", a.model, "Model directory (config.json + safetensors)")->required();
  sub->add_option("--tokenizer", a.tokenizer, "tiktoken.model (default: MODEL/tiktoken.model)");
  sub->add_option("--dtype", a.dtype, "Activation dtype: bf16 (default) or f32");
  sub->add_option("--kv-dtype", a.kv_dtype,
                  "MLA latent cache dtype: auto (f32 with --dtype f32, else bf16), bf16, fp8, f32");
  sub->add_option("--threads", a.threads,
                  "Threads (default: the physical cores this process may run on)");
  sub->add_option("--kv-budget", a.kv_budget,
                  "Bytes (K/M/G suffixes) for the KDA states and latent cache of running "
                  "sequences, or auto (default: a full context per sequence)");
  sub->add_option("--ctx-size", a.ctx_size,
                  "Context length in tokens (default: the model's max_position_embeddings)");
  add_mmap_flag(sub, a.mmap);
}

void add_mmap_flag(CLI::App* sub, bool& mmap) {
  sub->add_flag("--mmap", mmap,
                "View the weights in the file mapping instead of reading them into memory "
                "(faster start, page cache shared between processes; slower decode); the dense "
                "projections are still read, packed for their kernels");
}

Result<int64_t> parse_bytes(const std::string& s, const char* flag) {
  if (s == "auto") return int64_t{-1};
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  double mul = 1;
  const std::string suffix = end ? std::string(end) : "";
  if (suffix == "K" || suffix == "k") mul = 1024.0;
  if (suffix == "M" || suffix == "m") mul = 1024.0 * 1024;
  if (suffix == "G" || suffix == "g") mul = 1024.0 * 1024 * 1024;
  const bool suffix_ok = suffix.empty() || mul > 1;
  if (end == s.c_str() || errno != 0 || !suffix_ok || !(v > 0) || v * mul > 9.0e18)
    return Status(ErrorCode::kInvalidArgument, std::string(flag) + " is '" + s +
                                                   "', expected a positive byte count (e.g. "
                                                   "4294967296, 512M, 4G) or auto");
  return static_cast<int64_t>(v * mul);
}

Status apply_threads(int threads) {
  if (threads < 0 || threads > 4096)
    return Status(ErrorCode::kInvalidArgument,
                  "--threads is " + std::to_string(threads) + ", expected 1..4096 (0: default)");
  set_thread_count(threads > 0 ? threads : default_thread_count());
  return Status::ok();
}

Result<std::shared_ptr<const Model>> load_cli_model(const ModelArgs& a, bool need_tokenizer,
                                                    bool progress) {
  ATTNRES_RETURN_IF_ERROR(apply_threads(a.threads));
  ModelLoadOptions o;
  o.dir = a.model;
  o.tokenizer = a.tokenizer;
  o.require_tokenizer = need_tokenizer;
  o.mmap = a.mmap;
  const bool show = progress && stderr_is_terminal();
  if (show) {
    std::fprintf(stderr, "loading %s ...", a.model.c_str());
    o.progress = [](const std::string& line) { std::fprintf(stderr, "\r%s\n", line.c_str()); };
  }
  auto m = Model::load(o);
  if (!m.is_ok()) {
    if (show) std::fprintf(stderr, "\n");
    return m;
  }
  const ModelInfo& info = m.value()->info();
  const std::string warning = huge_pages_warning(info.bytes_in_memory, info.bytes_in_memory_huge);
  if (!warning.empty()) std::fprintf(stderr, "%s\n", warning.c_str());
  return m;
}

Result<EngineOptions> engine_options(const ModelArgs& a) {
  EngineOptions o;
  if (a.dtype == "bf16") {
    o.activation = ActivationType::kBF16;
  } else if (a.dtype == "f32") {
    o.activation = ActivationType::kF32;
  } else {
    return Status(ErrorCode::kInvalidArgument,
                  "--dtype is '" + a.dtype + "', expected bf16 or f32");
  }
  auto kv_budget = parse_bytes(a.kv_budget, "--kv-budget");
  if (!kv_budget) return kv_budget.status();
  if (a.ctx_size < 0)
    return Status(ErrorCode::kInvalidArgument,
                  "--ctx-size is " + std::to_string(a.ctx_size) + ", expected tokens >= 1");
  o.kv_budget = *kv_budget;
  o.context_length = a.ctx_size;
  if (a.kv_dtype == "auto") {
    o.cache = CacheType::kAuto;
  } else if (a.kv_dtype == "bf16") {
    o.cache = CacheType::kBF16;
  } else if (a.kv_dtype == "fp8") {
    o.cache = CacheType::kFP8;
  } else if (a.kv_dtype == "f32") {
    o.cache = CacheType::kF32;
  } else {
    return Status(ErrorCode::kInvalidArgument,
                  "--kv-dtype is '" + a.kv_dtype + "', expected auto, bf16, fp8 or f32");
  }
  return o;
}

void add_sampling_options(CLI::App* sub, SamplingArgs& a) {
  sub->add_option("--max-new-tokens", a.max_new_tokens, "Most tokens to generate (default 256)");
  sub->add_option("--temperature", a.temperature, "Sampling temperature (0 = greedy, default)");
  sub->add_option("--top-k", a.top_k, "Keep the k most likely tokens (0 = off)");
  sub->add_option("--top-p", a.top_p, "Nucleus sampling mass (1 = off)");
  sub->add_option("--min-p", a.min_p, "Drop tokens below min_p x the top probability (0 = off)");
  sub->add_option("--repetition-penalty", a.repetition_penalty, "CTRL-style penalty (1 = off)");
  sub->add_option("--presence-penalty", a.presence_penalty, "OpenAI presence penalty (0 = off)");
  sub->add_option("--frequency-penalty", a.frequency_penalty, "OpenAI frequency penalty (0 = off)");
  sub->add_option("--seed", a.seed, "Sampling seed (same seed, same tokens)");
  sub->add_option("--stop", a.stop, "Stop string (repeatable)");
}

GenerationRequest sampling_request(const SamplingArgs& a) {
  GenerationRequest r;
  r.max_new_tokens = a.max_new_tokens;
  r.stop_strings = a.stop;
  SamplingParams& sp = r.sampling;
  sp.temperature = a.temperature;
  sp.top_k = a.top_k;
  sp.top_p = a.top_p;
  sp.min_p = a.min_p;
  sp.repetition_penalty = a.repetition_penalty;
  sp.presence_penalty = a.presence_penalty;
  sp.frequency_penalty = a.frequency_penalty;
  sp.seed = a.seed;
  return r;
}

std::string_view stop_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStopToken:
      return "token";
    case FinishReason::kStopString:
      return "string";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kContext:
      return "context";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

namespace {

// Prefill progress: after kQuietSeconds an updating line on a terminal; otherwise one summary
// line at the end for prefills that took that long.
constexpr double kQuietSeconds = 3.0;

struct PrefillProgress {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  bool tty = stderr_is_terminal(), shown = false;
  int64_t done = 0, total = 0;

  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  void update(int64_t d, int64_t t) {
    done = d;
    total = t;
    const double s = elapsed();
    if (!tty || s < kQuietSeconds) return;
    std::fprintf(stderr, "\rprefill %lld/%lld tokens, %.0f tok/s", static_cast<long long>(d),
                 static_cast<long long>(t), static_cast<double>(d) / s);
    shown = true;
  }
  void end() const {
    const double s = elapsed();
    if (shown) std::fprintf(stderr, "\n");
    if (!tty && s >= kQuietSeconds && total > 0)
      std::fprintf(stderr, "prefill %lld/%lld tokens in %.1f s\n", static_cast<long long>(done),
                   static_cast<long long>(total), s);
  }
};

}  // namespace

Result<GenerationResult> run_request(Engine& engine, GenerationRequest request,
                                     const std::function<void(std::string_view)>& on_text,
                                     const std::atomic<bool>* cancel, bool progress) {
  GenerationResult result;
  bool done = false;
  PrefillProgress pp;
  GenerationCallbacks cb;
  cb.on_token = [&](const TokenEvent& e) {
    if (!e.text.empty() && on_text) on_text(e.text);
  };
  cb.on_finish = [&](GenerationResult&& r) {
    result = std::move(r);
    done = true;
  };
  if (progress) cb.on_prefill = [&](int64_t d, int64_t t) { pp.update(d, t); };
  ATTNRES_ASSIGN_OR_RETURN(const RequestId id, engine.submit(std::move(request), std::move(cb)));
  bool cancelled = false;
  while (!done) {
    if (cancel != nullptr && cancel->load() && !cancelled) {
      engine.cancel(id);
      cancelled = true;
    }
    ATTNRES_RETURN_IF_ERROR(engine.step());
  }
  if (progress) pp.end();
  if (result.reason == FinishReason::kError) return result.error;
  return result;
}

}  // namespace attnres::cli
