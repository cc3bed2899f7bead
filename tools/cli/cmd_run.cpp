// attnres run: greedy generation on a model directory (published layout).
//   run --model DIR (--prompt-ids 1,2,3 | --prompt-file F) [--max-new-tokens N]
//       [--chunk-size C] [--dtype bf16|f32] [--kv-dtype bf16|fp8|f32] [--ignore-eos]
//       [--dump-logits OUT.safetensors [--overwrite]] [--json]
// The prompt file holds token ids separated by commas and/or whitespace. Generation stops after
// N tokens or when the config's eos_token_id is chosen (kept), unless --ignore-eos.
// --dump-logits writes F32 `prefill_logits` [P, V], F32 `decode_logits` [G, V] (row j = the
// logits generated token j was chosen from; row 0 = the last prefill row) and I64 `tokens`
// [P + G]; an existing file is replaced only with --overwrite, never an input of the run
// (io/output.h check_output_path). Output: the generated ids on stdout (or one JSON object with
// --json); timings on stderr. Errors name the file, flag or token and exit with status 1.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "io/output.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "runtime/session.h"

namespace attnres::cli {
namespace {

struct RunArgs {
  std::string model;
  std::string prompt_ids;
  std::string prompt_file;
  int64_t max_new_tokens = 16;
  int64_t chunk_size = 4096;
  std::string dtype = "bf16";
  std::string kv_dtype = "auto";
  std::string dump;
  bool ignore_eos = false;
  bool overwrite = false;
  bool json = false;
};

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

int run(const RunArgs& a) {
  if (a.prompt_ids.empty() == a.prompt_file.empty())
    return fail("give exactly one of --prompt-ids and --prompt-file");
  std::vector<int32_t> prompt;
  if (!a.prompt_ids.empty()) {
    auto ids = parse_ids(a.prompt_ids, "--prompt-ids");
    if (!ids.is_ok()) return fail(ids.status().message());
    prompt = std::move(ids).value();
  } else {
    std::ifstream in(a.prompt_file, std::ios::binary);
    if (!in) return fail(a.prompt_file + ": cannot open prompt file");
    std::stringstream ss;
    ss << in.rdbuf();
    auto ids = parse_ids(ss.str(), a.prompt_file);
    if (!ids.is_ok()) return fail(ids.status().message());
    prompt = std::move(ids).value();
  }
  if (a.max_new_tokens < 1) return fail("--max-new-tokens must be >= 1");

  SessionOptions so;
  so.chunk_size = a.chunk_size;
  so.forward.act = a.dtype == "f32" ? ActDType::kF32 : ActDType::kBF16;
  if (a.kv_dtype == "bf16") so.forward.kv = KvCacheDtype::kBF16;
  if (a.kv_dtype == "fp8") so.forward.kv = KvCacheDtype::kFP8;
  if (a.kv_dtype == "f32") so.forward.kv = KvCacheDtype::kF32;

  auto weights = load_model(a.model);
  if (!weights.is_ok()) return fail(weights.status().to_string());
  const ModelWeights& w = weights.value();
  const int64_t V = w.config.vocab_size;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] >= V)
      return fail("prompt token " + std::to_string(prompt[i]) + " at position " +
                  std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  std::string dump_path;  // where the logits go: --dump-logits, or the file a link names
  if (!a.dump.empty()) {
    OutputCheck check;
    check.flag = "--dump-logits";
    check.overwrite = a.overwrite;
    check.inputs = model_input_files(w, a.model);
    if (!a.prompt_file.empty()) check.inputs.push_back(a.prompt_file);
    auto path = check_output_path(a.dump, check);
    if (!path) return fail(path.status().to_string());
    dump_path = *path;
  }
  auto session = Session::create(w, so);
  if (!session.is_ok()) return fail(session.status().to_string());
  const int64_t stop = a.ignore_eos ? -1 : w.config.eos_token_id.value_or(-1);
  auto gen = generate_greedy(**session, prompt, a.max_new_tokens, stop, !a.dump.empty());
  if (!gen.is_ok()) return fail(gen.status().to_string());
  const GenerateResult& r = gen.value();
  const int64_t P = static_cast<int64_t>(prompt.size()),
                G = static_cast<int64_t>(r.generated.size());

  if (!a.dump.empty()) {
    std::vector<int64_t> tokens(prompt.begin(), prompt.end());
    tokens.insert(tokens.end(), r.generated.begin(), r.generated.end());
    std::vector<TensorToWrite> t = {
        {"prefill_logits", DType::kF32, {P, V}, r.prefill_logits.data()},
        {"decode_logits", DType::kF32, {G, V}, r.decode_logits.data()},
        {"tokens", DType::kI64, {P + G}, tokens.data()},
    };
    Status st =
        write_safetensors(dump_path, t,
                          {{"dtype", a.dtype},
                           {"kv_dtype", std::string(kv_cache_dtype_name(so.forward.cache_dtype()))},
                           {"chunk_size", std::to_string(a.chunk_size)}});
    if (!st.is_ok()) return fail(st.to_string());
  }
  const double pre_tps = r.prefill_seconds > 0 ? static_cast<double>(P) / r.prefill_seconds : 0;
  const double dec_steps = static_cast<double>(G > 0 ? G - 1 : 0);
  const double dec_tps = r.decode_seconds > 0 ? dec_steps / r.decode_seconds : 0;
  if (a.json) {
    nlohmann::json j;
    j["model"] = a.model;
    j["prompt_tokens"] = P;
    j["generated"] = r.generated;
    j["dtype"] = a.dtype;
    j["kv_dtype"] = kv_cache_dtype_name(so.forward.cache_dtype());
    j["chunk_size"] = a.chunk_size;
    j["prefill_seconds"] = r.prefill_seconds;
    j["decode_seconds"] = r.decode_seconds;
    j["prefill_tokens_per_second"] = pre_tps;
    j["decode_tokens_per_second"] = dec_tps;
    if (!a.dump.empty()) j["dump"] = a.dump;
    std::cout << j.dump() << "\n";
  } else {
    for (size_t i = 0; i < r.generated.size(); ++i) std::cout << (i ? " " : "") << r.generated[i];
    std::cout << "\n";
    std::fprintf(
        stderr,
        "prefill %lld tokens in %.3f s (%.1f tok/s); decode %lld tokens in %.3f s (%.1f tok/s)\n",
        static_cast<long long>(P), r.prefill_seconds, pre_tps, static_cast<long long>(dec_steps),
        r.decode_seconds, dec_tps);
  }
  return 0;
}

const CommandRegistration kReg(
    "run", "greedy generation on a model directory (optionally dumping every logit row)",
    [](CLI::App* sub) -> CommandRun {
      auto a = std::make_shared<RunArgs>();
      sub->add_option("--model", a->model, "model directory (config.json + safetensors)")
          ->required();
      sub->add_option("--prompt-ids", a->prompt_ids, "prompt token ids, e.g. 1,2,3");
      sub->add_option("--prompt-file", a->prompt_file,
                      "file of prompt token ids (commas and/or whitespace)");
      sub->add_option("--max-new-tokens", a->max_new_tokens, "tokens to generate")
          ->capture_default_str();
      sub->add_option("--chunk-size", a->chunk_size, "prefill chunk length")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
      sub->add_option("--dtype", a->dtype, "activation dtype")
          ->capture_default_str()
          ->check(CLI::IsMember({"bf16", "f32"}));
      sub->add_option("--kv-dtype", a->kv_dtype,
                      "MLA latent cache dtype (auto = f32 with --dtype f32, else bf16)")
          ->capture_default_str()
          ->check(CLI::IsMember({"auto", "bf16", "fp8", "f32"}));
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
