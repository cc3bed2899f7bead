// libFuzzer target: a whole model directory decoded from one input (config.json, safetensors
// headers, shard index, tokenizer files together), through everything `attnres inspect` checks
// (check_model_dir: config validation, weight binding, storage plan, tokenizer against the
// vocabulary), then, when the loader accepts a model of tiny shapes, one forward token through
// the planned path `run` uses. The parsers have their own fuzzers; this one finds what only
// their combination reaches (a config value that indexes a header's tensor, a tokenizer id
// against the config's vocabulary, a kernel table sized by a config value).
//
// Input format: sections, each a line "==> NAME <==" (as head(1) prints between files) and
// the file's bytes up to the next "\n==> " or the end. NAME is one of config.json,
// model.safetensors.index.json, tiktoken.model, tokenizer_config.json, model.safetensors or
// model-NNNNN-of-NNNNN.safetensors; other names are ignored. A safetensors section holds only
// the header JSON: the file written is its 8-byte length, the header and a data section as
// long as the largest end offset the header names (filled with 0x3c: bf16/f32 ~0.0115, small
// MXFP4 scales, so the forward stays finite), at most kMaxDataBytes (a larger offset gets a
// truncated file, which the loader must refuse). Seeds: fuzz/corpus/model_dir, written by
// scripts/gen-fuzz-model-seeds.py from the golden tiny models shrunk to two layers.
//
// Invariants: nothing crashes, leaks or reads out of bounds (ASan/UBSan); every error has a
// message; a model check() accepts binds every layer and, when forwarded, gives one row of
// vocab_size logits.
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "check/model_check.h"
#include "model/arena.h"
#include "model/kv_cache.h"
#include "model/planned.h"
#include "model/state.h"

namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxDataBytes = uint64_t{8} << 20;

bool known_name(std::string_view n) {
  if (n == "config.json" || n == "model.safetensors.index.json" || n == "tiktoken.model" ||
      n == "tokenizer_config.json" || n == "model.safetensors")
    return true;
  // model-NNNNN-of-NNNNN.safetensors
  if (n.size() != 32 || !n.starts_with("model-") || !n.ends_with(".safetensors") ||
      n.substr(11, 4) != "-of-")
    return false;
  for (size_t i : {6, 7, 8, 9, 10, 15, 16, 17, 18, 19})
    if (n[i] < '0' || n[i] > '9') return false;
  return true;
}

// Largest end offset a header names (0 when it is not JSON of the expected shape: the loader
// then reports what is wrong with it).
uint64_t data_bytes(std::string_view header) {
  const auto j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return 0;
  uint64_t end = 0;
  for (const auto& [name, v] : j.items()) {
    if (!v.is_object()) continue;
    auto it = v.find("data_offsets");
    if (it == v.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_unsigned())
      continue;
    end = std::max(end, (*it)[1].get<uint64_t>());
  }
  return end;
}

void write_file(const fs::path& p, std::string_view name, std::string_view body) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  if (!name.ends_with(".safetensors")) {
    out.write(body.data(), static_cast<std::streamsize>(body.size()));
    return;
  }
  char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<char>(static_cast<uint64_t>(body.size()) >> (8 * i));
  out.write(len, 8);
  out.write(body.data(), static_cast<std::streamsize>(body.size()));
  const std::string data(static_cast<size_t>(std::min(data_bytes(body), kMaxDataBytes)), '\x3c');
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

// The model directory of this process, emptied before every input and removed at exit.
const fs::path& model_dir() {
  static const fs::path dir = [] {
    std::string t = (fs::temp_directory_path() / "attnres-fuzz-model-XXXXXX").string();
    if (::mkdtemp(t.data()) == nullptr) std::abort();
    return fs::path(t);
  }();
  static const bool cleanup = [] {
    return std::atexit([] {
             std::error_code ec;
             fs::remove_all(dir, ec);
           }) == 0;
  }();
  (void)cleanup;
  return dir;
}

// Small enough that one forward token takes well under a millisecond per layer.
bool tiny_shapes(const attnres::ModelWeights& w) {
  const attnres::ModelConfig& c = w.config;
  return c.num_hidden_layers <= 4 && c.hidden_size <= 256 && c.vocab_size <= 4096 &&
         c.intermediate_size <= 1024 && c.moe_intermediate_size <= 1024 && c.num_experts <= 32 &&
         c.num_attention_heads <= 8 && c.linear.num_heads <= 8 && c.linear.head_dim <= 128 &&
         c.qk_nope_head_dim + c.qk_rope_head_dim <= 256 && c.v_head_dim <= 128 &&
         c.kv_lora_rank <= 256 && c.q_lora_rank <= 256 &&
         c.routed_expert_hidden_size.value_or(0) <= 256 && w.report.bytes_mapped <= 16 << 20;
}

void forward_one_token(const attnres::ModelWeights& w) {
  using namespace attnres;
  auto fwd = PlannedForward::create(w, ActDType::kBF16, /*max_tokens=*/1);
  if (!fwd.is_ok()) {
    if (fwd.status().message().empty()) std::abort();
    return;
  }
  KvPool pool(w.config, KvCacheDtype::kBF16, /*page_tokens=*/16);
  auto created = SequenceState::create(w.config, pool);
  if (!created.is_ok()) {
    if (created.status().message().empty()) std::abort();
    return;
  }
  SequenceState state = std::move(created).value();
  Arena arena;
  ForwardOptions opt;
  std::vector<float> logits(static_cast<size_t>(w.config.vocab_size));
  const int32_t token = 0;
  Status s = (*fwd)->run(state, opt, arena, &token, 1, /*all_logits=*/false, logits.data());
  if (!s.is_ok() && s.message().empty()) std::abort();
  if (s.is_ok() && state.position != 1) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const fs::path& dir = model_dir();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) fs::remove_all(e.path(), ec);
  if (!in.starts_with("==> ")) return 0;
  size_t pos = 0;
  int files = 0;
  while (pos < in.size() && files < 8) {
    const size_t name_end = in.find(" <==\n", pos);
    if (name_end == std::string_view::npos) break;
    const std::string_view name = in.substr(pos + 4, name_end - pos - 4);
    const size_t body = name_end + 5;
    size_t next = in.find("\n==> ", body);
    const std::string_view content =
        in.substr(body, next == std::string_view::npos ? std::string_view::npos : next - body);
    if (known_name(name)) {
      write_file(dir / std::string(name), name, content);
      ++files;
    }
    if (next == std::string_view::npos) break;
    pos = next + 1;
  }

  auto checked = attnres::check_model_dir(dir.string());
  if (!checked.is_ok()) {
    if (checked.status().message().empty()) std::abort();  // every error explains itself
    return 0;
  }
  const attnres::ModelWeights& w = checked->weights;
  if (w.layers.size() != static_cast<size_t>(w.config.num_hidden_layers)) std::abort();
  if (checked->tokenizer && checked->tokenizer->vocab_size > w.config.vocab_size) std::abort();
  if (tiny_shapes(w)) forward_one_token(w);
  return 0;
}
