// attnres run: greedy generation on a model directory (published layout).
//   run --model DIR (--prompt-ids 1,2,3 | --prompt-file F | --prompts-file F) [--max-new-tokens N]
//       [--chunk-size C] [--dtype bf16|f32] [--kv-dtype bf16|fp8|f32] [--ignore-eos]
//       [--dump-logits OUT.safetensors [--overwrite]] [--json]
// The prompt file holds token ids separated by commas and/or whitespace. --prompts-file holds
// one prompt per non-empty line; they run concurrently through one engine (one sequence each,
// sharing every step). Generation stops after N tokens or when the config's eos_token_id is
// chosen (kept), unless --ignore-eos.
// --dump-logits writes F32 `prefill_logits` [P, V], F32 `decode_logits` [G, V] (row j = the
// logits generated token j was chosen from; row 0 = the last prefill row) and I64 `tokens`
// [P + G]; with --prompts-file the same three per prompt i, named `<name>.<i>`. An existing file
// is replaced only with --overwrite, never an input of the run (io/output.h check_output_path).
// Output: the generated ids on stdout, one line per prompt (or one JSON object with --json);
// timings on stderr. Errors name the file, flag or token and exit with status 1. Under mpirun the
// run is tensor-parallel (docs/parallel.md); --json reports `ranks`.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "frontend.h"
#include "io/output.h"       // the dump path's checks
#include "io/safetensors.h"  // the logit dump's file format
#include "io/weights.h"      // model_input_files

namespace attnres::cli {
namespace {

struct RunArgs {
  ModelArgs model;
  std::string prompt_ids;
  std::string prompt_file;
  std::string prompts_file;
  int64_t max_new_tokens = 16;
  int64_t chunk_size = 4096;
  std::string dump;
  bool ignore_eos = false;
  bool overwrite = false;
  bool json = false;
};

std::string kv_dtype_name(const EngineOptions& o) {
  switch (o.cache) {
    case CacheType::kBF16:
      return "bf16";
    case CacheType::kFP8:
      return "fp8";
    case CacheType::kF32:
      return "f32";
    default:
      return o.activation == ActivationType::kF32 ? "f32" : "bf16";
  }
}

Result<std::vector<int32_t>> parse_ids(const std::string& s, const std::string& where) {
  std::vector<int32_t> ids;
  std::string tok;
  auto flush = [&]() -> Status {
    if (tok.empty()) return Status::ok();
    char* end = nullptr;
    const long long v = std::strtoll(tok.c_str(), &end, 10);
    if (end == tok.c_str() || *end != '\0' || v < 0 || v > INT32_MAX) {
      return Status(ErrorCode::kInvalidArgument,
                    where + ": '" + tok + "' is not a token id (expected an integer >= 0)");
    }
    ids.push_back(static_cast<int32_t>(v));
    tok.clear();
    return Status::ok();
  };
  for (char c : s) {
    if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      ATTNRES_RETURN_IF_ERROR(flush());
    } else {
      tok += c;
    }
  }
  ATTNRES_RETURN_IF_ERROR(flush());
  if (ids.empty()) return Status(ErrorCode::kInvalidArgument, where + ": no token ids");
  return ids;
}

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(ErrorCode::kIoError, path + ": cannot open prompt file");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The prompts: one (--prompt-ids, --prompt-file) or one per non-empty line (--prompts-file).
Result<std::vector<std::vector<int32_t>>> read_prompts(const RunArgs& a) {
  const int given = !a.prompt_ids.empty() + !a.prompt_file.empty() + !a.prompts_file.empty();
  if (given != 1)
    return Status(ErrorCode::kInvalidArgument,
                  "give exactly one of --prompt-ids, --prompt-file and --prompts-file");
  std::vector<std::vector<int32_t>> out;
  if (!a.prompt_ids.empty()) {
    ATTNRES_ASSIGN_OR_RETURN(auto ids, parse_ids(a.prompt_ids, "--prompt-ids"));
    out.push_back(std::move(ids));
    return out;
  }
  const std::string& path = a.prompt_file.empty() ? a.prompts_file : a.prompt_file;
  ATTNRES_ASSIGN_OR_RETURN(std::string text, read_text(path));
  if (!a.prompt_file.empty()) {
    ATTNRES_ASSIGN_OR_RETURN(auto ids, parse_ids(text, path));
    out.push_back(std::move(ids));
    return out;
  }
  std::stringstream ss(text);
  std::string line;
  for (int n = 1; std::getline(ss, line); ++n) {
    if (line.find_first_not_of(" \t\r,") == std::string::npos) continue;
    ATTNRES_ASSIGN_OR_RETURN(auto ids, parse_ids(line, path + " line " + std::to_string(n)));
    out.push_back(std::move(ids));
  }
  if (out.empty()) return Status(ErrorCode::kInvalidArgument, path + ": no prompts");
  return out;
}

Status dump_logits(const RunArgs& a, const EngineOptions& eo,
                   const std::vector<std::vector<int32_t>>& prompts,
                   const std::vector<GenerationResult>& results, int64_t V,
                   const std::string& path) {
  std::vector<TensorToWrite> t;
  std::vector<std::vector<int64_t>> tokens(prompts.size());
  const bool many = !a.prompts_file.empty();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const GenerationResult& r = results[i];
    const int64_t P = std::ssize(prompts[i]), G = std::ssize(r.tokens);
    tokens[i].assign(prompts[i].begin(), prompts[i].end());
    tokens[i].insert(tokens[i].end(), r.tokens.begin(), r.tokens.end());
    const std::string sfx = many ? "." + std::to_string(i) : "";
    t.push_back({"prefill_logits" + sfx, DType::kF32, {P, V}, r.prompt_logits.data()});
    t.push_back({"decode_logits" + sfx, DType::kF32, {G, V}, r.token_logits.data()});
    t.push_back({"tokens" + sfx, DType::kI64, {P + G}, tokens[i].data()});
  }
  return write_safetensors(path, t,
                           {{"dtype", a.model.dtype},
                            {"kv_dtype", kv_dtype_name(eo)},
                            {"chunk_size", std::to_string(a.chunk_size)}});
}

// Runs every prompt to its end on one engine, all submitted at once.
Result<std::vector<GenerationResult>> run_all(Engine& engine, std::vector<GenerationRequest> reqs,
                                              bool progress) {
  if (reqs.size() == 1) {
    ATTNRES_ASSIGN_OR_RETURN(GenerationResult r,
                             run_request(engine, std::move(reqs[0]), nullptr, nullptr, progress));
    return std::vector<GenerationResult>{std::move(r)};
  }
  std::vector<GenerationResult> out(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    GenerationCallbacks cb;
    cb.on_finish = [&out, i](GenerationResult&& r) { out[i] = std::move(r); };
    ATTNRES_RETURN_IF_ERROR(engine.submit(std::move(reqs[i]), std::move(cb)).status());
  }
  ATTNRES_RETURN_IF_ERROR(engine.run());
  for (const GenerationResult& r : out)
    if (r.reason == FinishReason::kError) return r.error;
  return out;
}

int run(const RunArgs& a) {
  auto prompts = read_prompts(a);
  if (!prompts.is_ok()) return fail(prompts.status().message());
  if (a.max_new_tokens < 1) return fail("--max-new-tokens must be >= 1");
  auto eo = engine_options(a.model);
  if (!eo) return fail(eo.status().to_string());
  eo->max_sequences = static_cast<int>(prompts->size());
  eo->prefill_chunk = a.chunk_size;
  auto model = load_cli_model(a.model, /*need_tokenizer=*/false, /*progress=*/false);
  if (!model.is_ok()) return fail(model.status().to_string());
  std::string dump_path;  // where the logits go: --dump-logits, or the file a link names
  if (!a.dump.empty()) {
    OutputCheck check;
    check.flag = "--dump-logits";
    check.overwrite = a.overwrite;
    check.inputs = model_input_files((*model)->weights(), a.model.model);
    if (!a.prompt_file.empty()) check.inputs.push_back(a.prompt_file);
    if (!a.prompts_file.empty()) check.inputs.push_back(a.prompts_file);
    auto path = check_output_path(a.dump, check);
    if (!path) return fail(path.status().to_string());
    dump_path = *path;
  }
  auto engine = Engine::create(*model, *eo);
  if (!engine.is_ok()) return fail(engine.status().to_string());
  const ModelInfo& info = (*model)->info();
  std::vector<GenerationRequest> reqs;
  for (const auto& p : *prompts) {
    GenerationRequest req;
    req.prompt = p;
    req.sampling.temperature = 0;
    req.max_new_tokens = a.max_new_tokens;
    req.keep_logits = !a.dump.empty();
    // run stops only at the config's eos_token_id (not the chat stop token), unless --ignore-eos.
    req.ignore_eos = true;
    if (!a.ignore_eos && info.eos_token >= 0) req.stop_tokens.push_back(info.eos_token);
    reqs.push_back(std::move(req));
  }
  auto gen = run_all(**engine, std::move(reqs), !a.json);
  if (!gen.is_ok()) return fail(gen.status().to_string());
  if (!a.dump.empty()) {
    if (Status st = dump_logits(a, *eo, *prompts, *gen, info.vocab_size, dump_path); !st.is_ok())
      return fail(st.to_string());
  }
  const GenerationResult& r = gen->front();
  const int64_t P = std::ssize(prompts->front()), G = std::ssize(r.tokens);
  const double pre_tps = r.ttft_seconds > 0 ? static_cast<double>(P) / r.ttft_seconds : 0;
  const double dec_steps = static_cast<double>(G > 0 ? G - 1 : 0);
  const double dec_tps = r.decode_seconds > 0 ? dec_steps / r.decode_seconds : 0;
  const EngineStats& es = (*engine)->stats();
  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model.model;
    j["prompt_tokens"] = P;
    j["generated"] = r.tokens;
    if (gen->size() > 1) {
      j["generated_per_prompt"] = nlohmann::json::array();
      for (const GenerationResult& g : *gen) j["generated_per_prompt"].push_back(g.tokens);
    }
    j["dtype"] = a.model.dtype;
    j["kv_dtype"] = kv_dtype_name(*eo);
    j["chunk_size"] = a.chunk_size;
    j["threads"] = thread_count();
    j["ranks"] = info.ranks;
    j["rank_weight_bytes"] = info.rank_weight_bytes;
    j["rank_copy_bytes"] = info.rank_copy_bytes;
    j["collectives"] = es.collectives;
    j["gather_bytes"] = es.gather_bytes;
    j["prefill_seconds"] = r.ttft_seconds;
    j["decode_seconds"] = r.decode_seconds;
    j["prefill_tokens_per_second"] = pre_tps;
    j["decode_tokens_per_second"] = dec_tps;
    if (!a.dump.empty()) j["dump"] = a.dump;
    std::cout << j.dump() << "\n";
  } else {
    for (const GenerationResult& g : *gen) {
      for (size_t i = 0; i < g.tokens.size(); ++i) std::cout << (i ? " " : "") << g.tokens[i];
      std::cout << "\n";
    }
    std::fprintf(
        stderr,
        "prefill %lld tokens in %.3f s (%.1f tok/s); decode %lld tokens in %.3f s (%.1f tok/s)%s\n",
        static_cast<long long>(P), r.ttft_seconds, pre_tps, static_cast<long long>(dec_steps),
        r.decode_seconds, dec_tps,
        info.ranks > 1 ? (" on " + std::to_string(info.ranks) + " ranks").c_str() : "");
  }
  return 0;
}

const CommandRegistration kReg(
    "run", "greedy generation on a model directory (optionally dumping every logit row)",
    [](CLI::App* sub) -> CommandRun {
      auto a = std::make_shared<RunArgs>();
      add_model_options(sub, a->model);
      sub->add_option("--prompt-ids", a->prompt_ids, "prompt token ids, e.g. 1,2,3");
      sub->add_option("--prompt-file", a->prompt_file,
                      "file of prompt token ids (commas and/or whitespace)");
      sub->add_option("--prompts-file", a->prompts_file,
                      "file of several prompts, one per line, run concurrently");
      sub->add_option("--max-new-tokens", a->max_new_tokens, "tokens to generate")
          ->capture_default_str();
      sub->add_option("--chunk-size", a->chunk_size, "prefill chunk length")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
      sub->add_option("--dump-logits", a->dump, "write logits and tokens to this safetensors file")
          ->check([](const std::string& p) { return p.empty() ? "an empty path" : ""; });
      sub->add_flag("--overwrite", a->overwrite,
                    "--dump-logits may replace an existing file (never an input of the run)");
      sub->add_flag("--ignore-eos", a->ignore_eos, "do not stop at the config's eos_token_id");
      sub->add_flag("--json", a->json, "print one JSON object");
      return [a] { return run(*a); };
    });

}  // namespace
}  // namespace attnres::cli
