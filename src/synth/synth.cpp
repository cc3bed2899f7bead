#include "synth/synth.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "config/config.h"
#include "io/output.h"
#include "io/safetensors.h"
#include "io/weights.h"
#include "util/numeric.h"
#include "util/parallel.h"
#include "util/random.h"

namespace attnres {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// 1-based layer lists as published: MLA at every 4th layer and the last one, KDA elsewhere.
void set_layer_lists(json& tc, int layers) {
  json full = json::array(), kda = json::array();
  for (int l = 1; l <= layers; ++l) {
    if (l % 4 == 0 || l == layers)
      full.push_back(l);
    else
      kda.push_back(l);
  }
  tc["linear_attn_config"]["full_attn_layers"] = full;
  tc["linear_attn_config"]["kda_layers"] = kda;
}

// The published text_config with the size fields given.
json k3_text_config(int layers, int hidden, int vocab, int block, int kda_heads, int mla_heads,
                    int q_lora, int kv_lora, int nope, int rope, int v_dim, int dense_inter,
                    int experts, int topk, int shared, int moe_inter, int latent) {
  json tc = {
      {"activation_situ_beta", 4.0},
      {"activation_situ_linear_beta", 25.0},
      {"architectures", {"KimiLinearForCausalLM"}},
      {"attn_res_block_size", block},
      // Kimi's tokenizer layout: `vocab - 256` ranks, then 256 control ids, of which the first
      // is [BOS], the third <|end_of_msg|> (the eos/stop token) and the last [PAD].
      {"bos_token_id", vocab - 256},
      {"eos_token_id", vocab - 254},
      {"pad_token_id", vocab - 1},
      {"dtype", "bfloat16"},
      {"first_k_dense_replace", 1},
      {"hidden_act", "situ"},
      {"hidden_size", hidden},
      {"intermediate_size", dense_inter},
      {"kv_lora_rank", kv_lora},
      {"latent_moe_use_norm", true},
      {"linear_attn_config",
       {{"gate_lower_bound", -5.0},
        {"head_dim", 128},
        {"num_heads", kda_heads},
        {"short_conv_kernel_size", 4},
        {"use_full_rank_gate", true}}},
      {"max_position_embeddings", 1048576},
      {"mla_use_nope", true},
      {"mla_use_output_gate", true},
      {"model_type", "kimi_linear"},
      {"moe_intermediate_size", moe_inter},
      {"moe_layer_freq", 1},
      {"moe_renormalize", true},
      {"moe_router_activation_func", "sigmoid"},
      {"num_attention_heads", mla_heads},
      {"num_expert_group", 1},
      {"num_experts", experts},
      {"num_experts_per_token", topk},
      {"num_hidden_layers", layers},
      {"num_key_value_heads", mla_heads},
      {"num_nextn_predict_layers", 0},
      {"num_shared_experts", shared},
      {"q_lora_rank", q_lora},
      {"qk_nope_head_dim", nope},
      {"qk_rope_head_dim", rope},
      {"rms_norm_eps", 1e-5},
      {"routed_expert_hidden_size", latent},
      {"routed_scaling_factor", 1.0},
      {"tie_word_embeddings", false},
      {"topk_group", 1},
      {"topk_method", "noaux_tc"},
      {"use_cache", true},
      {"use_grouped_topk", true},
      {"v_head_dim", v_dim},
      {"vocab_size", vocab},
      {"quantization_config",
       {{"format", "mxfp4-pack-quantized"},
        {"quant_method", "compressed-tensors"},
        {"quantization_status", "compressed"},
        {"config_groups",
         {{"group_0",
           {{"format", "mxfp4-pack-quantized"},
            {"targets", {"Linear"}},
            {"weights",
             {{"group_size", 32},
              {"num_bits", 4},
              {"scale_dtype", "torch.uint8"},
              {"strategy", "group"},
              {"symmetric", true},
              {"type", "float"}}}}}}},
        {"ignore",
         {"re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
          "re:.*lm_head.*"}}}},
  };
  set_layer_lists(tc, layers);
  return tc;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.ends_with(suffix);
}

bool is_gain(const std::string& canon) {
  return ends_with(canon, "layernorm.weight") || ends_with(canon, "norm.weight");
}

// Fills `out` (numel elements of `dtype`) for the tensor `canon` of `shape`.
void fill_tensor(const std::string& canon, DType dtype, const std::vector<int64_t>& shape,
                 int64_t numel, uint64_t seed, std::byte* out) {
  // Seeded per (tensor, chunk) so the fill is the same whatever the thread count.
  constexpr int64_t kChunk = 1 << 16;
  const uint64_t base = fnv1a(canon) ^ (seed * 0x9e3779b97f4a7c15ull);
  const int64_t fan_in = shape.size() >= 2 ? shape[1] : 1;
  // value(i, u): u uniform in [-1, 1)
  float scale = std::sqrt(3.0f / static_cast<float>(fan_in));  // std 1/sqrt(fan_in)
  float offset = 0.0f;
  bool exp_of_uniform = false;  // A_log = log(U(1, 16))
  if (is_gain(canon)) {
    scale = 0.1f;
    offset = 1.0f;
  } else if (ends_with(canon, "embed_tokens.weight")) {
    scale = std::sqrt(3.0f);
  } else if (ends_with(canon, "_res_proj.weight")) {
    scale = 2.0f * std::sqrt(3.0f / static_cast<float>(shape.back()));
  } else if (ends_with(canon, "conv1d.weight")) {
    scale = 0.5f;
  } else if (ends_with(canon, "dt_bias")) {
    scale = 1.0f;
  } else if (ends_with(canon, "e_score_correction_bias")) {
    scale = 0.01f;
  } else if (ends_with(canon, "A_log")) {
    exp_of_uniform = true;
  }
  // E8M0 exponent for MXFP4 blocks: E2M1 magnitudes average ~2.6, so scale 2^e with
  // 2^e * 2.6 ~ 1/sqrt(K) gives rows of std ~1/sqrt(K).
  int e8m0_base = 127;
  if (ends_with(canon, "weight_scale")) {
    const double k = 32.0 * static_cast<double>(shape.back());
    e8m0_base = 127 + static_cast<int>(std::floor(std::log2(1.0 / (2.6 * std::sqrt(k)))));
  }
  const bool packed = ends_with(canon, "weight_packed");
  const bool scales = ends_with(canon, "weight_scale");
  const int64_t chunks = (numel + kChunk - 1) / kChunk;
  parallel_ranges(chunks, chunks > 1, [&](int64_t c_begin, int64_t c_end) {
    for (int64_t c = c_begin; c < c_end; ++c) {
      SplitMix64 rng{base + static_cast<uint64_t>(c) * 0xd1b54a32d192ed03ull};
      const int64_t end = std::min(numel, (c + 1) * kChunk);
      for (int64_t i = c * kChunk; i < end; ++i) {
        if (packed) {
          out[i] = static_cast<std::byte>(rng.next() & 0xff);
          continue;
        }
        if (scales) {
          out[i] = static_cast<std::byte>(e8m0_base + static_cast<int>(rng.next() & 1));
          continue;
        }
        float v = exp_of_uniform ? std::log(1.0f + 7.5f * (rng.uniform(-1.0f, 1.0f) + 1.0f))
                                 : offset + scale * rng.uniform(-1.0f, 1.0f);
        if (dtype == DType::kF32) {
          std::memcpy(out + i * 4, &v, 4);
        } else {
          const bf16 b = f32_to_bf16(v);
          std::memcpy(out + i * 2, &b.bits, 2);
        }
      }
    }
  });
}

std::string published_name(const std::string& canon) {
  if (canon == "lm_head.weight") return "language_model.lm_head.weight";
  return "language_model.model." + canon;
}

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint32_t{static_cast<uint8_t>(bytes[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out += kAlphabet[(v >> k) & 63];
  }
  if (i < bytes.size()) {
    uint32_t v = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (i + 1 < bytes.size()) v |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// A byte-level BPE rank file in tiktoken.model format with `n_ranks` ranks: the 256 single
// bytes, then printable-ASCII pairs, then lowercase (and space-led) triples, so every multi-byte
// token is reachable by merging lower-ranked ones. Plus the control-token names of Kimi's
// layout in a tokenizer_config.json (ids n_ranks + offset).
std::string synthetic_ranks(int64_t n_ranks) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  for (char a = ' '; a <= '~' && static_cast<int64_t>(tokens.size()) < n_ranks; ++a)
    for (char b = ' '; b <= '~' && static_cast<int64_t>(tokens.size()) < n_ranks; ++b)
      tokens.push_back(std::string{a, b});
  const std::string first = " abcdefghijklmnopqrstuvwxyz";
  for (char a : first)
    for (char b = 'a'; b <= 'z'; ++b)
      for (char c = 'a'; c <= 'z' && static_cast<int64_t>(tokens.size()) < n_ranks; ++c)
        tokens.push_back(std::string{a, b, c});
  for (char a : first)
    for (char b = 'a'; b <= 'z'; ++b)
      for (char c = 'a'; c <= 'z'; ++c)
        for (char d = 'a'; d <= 'z' && static_cast<int64_t>(tokens.size()) < n_ranks; ++d)
          tokens.push_back(std::string{a, b, c, d});
  std::string out;
  for (size_t r = 0; r < tokens.size(); ++r)
    out += base64(tokens[r]) + " " + std::to_string(r) + "\n";
  return out;
}

std::string synthetic_tokenizer_config(int64_t n_ranks) {
  static constexpr std::pair<int, const char*> kNames[] = {
      {0, "[BOS]"},     {1, "[EOS]"},   {2, "<|end_of_msg|>"}, {3, "<|open|>"},
      {4, "<|close|>"}, {5, "<|sep|>"}, {254, "[UNK]"},        {255, "[PAD]"}};
  json added = json::object();
  for (const auto& [offset, name] : kNames)
    added[std::to_string(n_ranks + offset)] = {{"content", name}, {"special", true}};
  const json cfg = {{"tokenizer_class", "TikTokenTokenizer"},
                    {"added_tokens_decoder", added},
                    {"bos_token", "[BOS]"},
                    {"eos_token", "[EOS]"}};
  return cfg.dump(2) + "\n";
}

// Whether make-model writes files named `name` (and may therefore replace or remove them with
// `overwrite`): the config, the single file or the shards and their index, the tokenizer.
bool is_owned_file(const std::string& name) {
  if (name == "config.json" || name == "model.safetensors" ||
      name == "model.safetensors.index.json" || name == "tiktoken.model" ||
      name == "tokenizer_config.json")
    return true;
  // model-NNNNN-of-NNNNN.safetensors
  if (name.size() != 32 || !name.starts_with("model-") || !name.ends_with(".safetensors") ||
      name.substr(11, 4) != "-of-")
    return false;
  for (size_t i : {6, 7, 8, 9, 10, 15, 16, 17, 18, 19})
    if (name[i] < '0' || name[i] > '9') return false;
  return true;
}

}  // namespace

std::vector<std::string> synth_preset_names() {
  return {"tiny", "k3-mini", "tp-odd", "deep"};
}

Result<SynthPreset> synth_preset(const std::string& name) {
  SynthPreset p;
  p.name = name;
  if (name == "tiny") {
    p.description = "7 layers, hidden 128, block 3 (3 slots, partial final block), 8 experts";
    p.text_config = k3_text_config(/*layers=*/7, /*hidden=*/128, /*vocab=*/512, /*block=*/3,
                                   /*kda_heads=*/2, /*mla_heads=*/2, /*q_lora=*/64,
                                   /*kv_lora=*/64, /*nope=*/32, /*rope=*/16, /*v_dim=*/32,
                                   /*dense_inter=*/256, /*experts=*/8, /*topk=*/2, /*shared=*/1,
                                   /*moe_inter=*/64, /*latent=*/64);
    p.text_config["linear_attn_config"]["head_dim"] = 32;
  } else if (name == "k3-mini") {
    p.description =
        "Kimi-K3 graph at ~2 GB: 20 layers, hidden 1024, block 6 (4 slots, partial final block), "
        "256 MXFP4 experts top-8, latent 512";
    p.text_config = k3_text_config(/*layers=*/20, /*hidden=*/1024, /*vocab=*/32768, /*block=*/6,
                                   /*kda_heads=*/8, /*mla_heads=*/8, /*q_lora=*/384,
                                   /*kv_lora=*/512, /*nope=*/128, /*rope=*/64, /*v_dim=*/128,
                                   /*dense_inter=*/4096, /*experts=*/256, /*topk=*/8,
                                   /*shared=*/2, /*moe_inter=*/512, /*latent=*/512);
    p.shard_bytes = int64_t{1} << 30;
  } else if (name == "tp-odd") {
    // Every split dimension leaves a remainder for P = 3 (and most for 2 and 4), so the
    // balanced partitions of tensor parallelism are uneven: 5 KDA and 5 MLA heads, 11 experts,
    // hidden 176, vocab 1000, q_lora 80, kv_lora + rope 52, latent 160, expert intermediate 224,
    // dense intermediate 304.
    p.description =
        "7 layers, hidden 176, 5 KDA / 5 MLA heads, 11 experts top-3, vocab 1000: no split "
        "dimension divisible by 3 (tensor-parallel tests)";
    p.text_config = k3_text_config(/*layers=*/7, /*hidden=*/176, /*vocab=*/1000, /*block=*/3,
                                   /*kda_heads=*/5, /*mla_heads=*/5, /*q_lora=*/80,
                                   /*kv_lora=*/44, /*nope=*/16, /*rope=*/8, /*v_dim=*/16,
                                   /*dense_inter=*/304, /*experts=*/11, /*topk=*/3, /*shared=*/1,
                                   /*moe_inter=*/224, /*latent=*/160);
    p.text_config["linear_attn_config"]["head_dim"] = 32;
  } else if (name == "deep") {
    // The published depth and block size at a small width: the KDA accuracy tests run the
    // whole stack (69 KDA layers) against a float64 evaluation of the same forward. All 4
    // experts are routed to every token, so there is no discrete expert choice that f32
    // rounding could flip: the logits are a continuous function of the weights.
    p.description =
        "published depth at small width: 93 layers, hidden 64, block 12 (8 slots, partial final "
        "block of 9), 69 KDA layers of 2 heads x 64, 4 MXFP4 experts all routed";
    p.text_config = k3_text_config(/*layers=*/93, /*hidden=*/64, /*vocab=*/512, /*block=*/12,
                                   /*kda_heads=*/2, /*mla_heads=*/2, /*q_lora=*/32,
                                   /*kv_lora=*/32, /*nope=*/16, /*rope=*/16, /*v_dim=*/16,
                                   /*dense_inter=*/128, /*experts=*/4, /*topk=*/4, /*shared=*/1,
                                   /*moe_inter=*/32, /*latent=*/32);
    p.text_config["linear_attn_config"]["head_dim"] = 64;
  } else {
    std::string known;
    for (const auto& n : synth_preset_names()) known += (known.empty() ? "" : ", ") + n;
    return Status(ErrorCode::kInvalidArgument,
                  "unknown model preset '" + name + "' (known: " + known + ")");
  }
  return p;
}

Result<SynthReport> write_synthetic_model(const SynthPreset& preset, const std::string& out_dir,
                                          uint64_t seed, bool overwrite,
                                          const SynthProgressFn& progress) {
  const json root = {{"architectures", {"KimiK3ForConditionalGeneration"}},
                     {"model_type", "kimi_k3"},
                     {"tie_word_embeddings", false},
                     {"bos_token_id", preset.text_config["bos_token_id"]},
                     {"eos_token_id", preset.text_config["eos_token_id"]},
                     {"pad_token_id", preset.text_config["pad_token_id"]},
                     {"text_config", preset.text_config}};
  const std::string config_text = root.dump(2) + "\n";
  const fs::path dir(out_dir);
  const std::string config_path = (dir / "config.json").string();
  ATTNRES_ASSIGN_OR_RETURN(ModelConfig cfg, parse_model_config(config_text, config_path));
  const std::vector<TensorSpec> specs = model_tensor_specs(cfg);

  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    return Status(ErrorCode::kInvalidArgument,
                  "--out '" + out_dir + "' exists and is not a directory");
  fs::create_directories(dir, ec);
  if (ec)
    return Status(ErrorCode::kIoError, out_dir + ": cannot create directory: " + ec.message());
  // Without overwrite nothing that looks like a checkpoint is touched; with it, the files this
  // writer owns are replaced or removed (so the directory loads exactly the new model), and
  // every one of them must be a regular, writable file (check_output_path).
  std::vector<std::string> owned;  // owned files present now
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string f = entry.path().filename().string();
    if (!overwrite && (is_owned_file(f) || f.ends_with(".safetensors")))
      return Status(
          ErrorCode::kInvalidArgument,
          out_dir + ": already holds '" + f + "'; choose an empty directory or pass --overwrite");
    if (is_owned_file(f)) owned.push_back(f);
  }
  if (ec) return Status(ErrorCode::kIoError, out_dir + ": cannot list directory: " + ec.message());
  std::sort(owned.begin(), owned.end());
  OutputCheck check;
  check.flag = "--out";
  check.overwrite = overwrite;
  check.follow_symlinks = false;  // never write through a link out of the directory
  for (const std::string& f : owned)
    ATTNRES_RETURN_IF_ERROR(check_output_path((dir / f).string(), check).status());
  // Assign tensors to shards (in order) by size.
  struct Planned {
    const TensorSpec* spec;
    DType dtype;
    std::vector<int64_t> shape;
    int64_t numel;
    int64_t bytes;
  };
  std::vector<std::vector<Planned>> shards(1);
  int64_t shard_size = 0, total = 0;
  for (const TensorSpec& s : specs) {
    Planned p{&s, s.u8 ? DType::kU8 : release_dtype(s.name), s.shape, 1, 0};
    // A_log ships zero-padded to head_dim when head_dim > num_heads, as the release does.
    if (s.name.ends_with("A_log") && cfg.linear.head_dim > s.shape[0])
      p.shape = {cfg.linear.head_dim};
    for (int64_t v : p.shape) p.numel *= v;
    p.bytes = p.numel * static_cast<int64_t>(dtype_size(p.dtype));
    if (preset.shard_bytes > 0 && shard_size > 0 && shard_size + p.bytes > preset.shard_bytes) {
      shards.emplace_back();
      shard_size = 0;
    }
    shards.back().push_back(std::move(p));
    shard_size += shards.back().back().bytes;
    total += shards.back().back().bytes;
  }

  SynthReport report;
  json weight_map = json::object();
  const int n = static_cast<int>(shards.size());
  // Progress: filling a tensor's bytes and writing them count the same.
  SynthProgress prog;
  prog.bytes_total = total;
  prog.files_total = n;
  auto tell = [&](std::string_view stage) {
    if (!progress) return;
    prog.stage = stage;
    progress(prog);
  };
  std::set<std::string> written;  // files of the new model
  for (int si = 0; si < n; ++si) {
    char fname[64];
    if (preset.shard_bytes > 0)
      std::snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", si + 1, n);
    else
      std::snprintf(fname, sizeof fname, "model.safetensors");
    std::vector<std::vector<std::byte>> buffers;
    std::vector<TensorToWrite> tensors;
    buffers.reserve(shards[static_cast<size_t>(si)].size());
    int64_t shard_bytes = 0;
    for (const Planned& p : shards[static_cast<size_t>(si)]) {
      buffers.emplace_back(static_cast<size_t>(p.bytes));
      fill_tensor(p.spec->name, p.dtype, p.shape, p.numel, seed, buffers.back().data());
      if (p.spec->name.ends_with("A_log") && p.shape[0] > p.spec->shape[0]) {
        // Zero the padding: only the first num_heads entries are meaningful.
        std::memset(buffers.back().data() + p.spec->shape[0] * 4, 0,
                    static_cast<size_t>((p.shape[0] - p.spec->shape[0]) * 4));
      }
      const std::string name = published_name(p.spec->name);
      tensors.push_back({name, p.dtype, p.shape, buffers.back().data()});
      weight_map[name] = fname;
      report.tensors++;
      shard_bytes += p.bytes;
      prog.bytes_filled += p.bytes;
      tell("filling");
    }
    tell("writing");
    ATTNRES_RETURN_IF_ERROR(write_safetensors(
        (dir / fname).string(), tensors,
        {{"format", "pt"}, {"attnres_preset", preset.name}, {"seed", std::to_string(seed)}}));
    written.insert(fname);
    report.files++;
    prog.bytes_written += shard_bytes;
    prog.files_done = report.files;
    tell("written");
  }
  report.bytes = total;
  if (preset.shard_bytes > 0) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    ATTNRES_RETURN_IF_ERROR(
        write_file_atomic((dir / "model.safetensors.index.json").string(), index.dump(2) + "\n"));
    written.insert("model.safetensors.index.json");
  }
  const int64_t n_ranks = cfg.vocab_size - 256;
  if (n_ranks >= 256) {
    ATTNRES_RETURN_IF_ERROR(
        write_file_atomic((dir / "tiktoken.model").string(), synthetic_ranks(n_ranks)));
    ATTNRES_RETURN_IF_ERROR(write_file_atomic((dir / "tokenizer_config.json").string(),
                                              synthetic_tokenizer_config(n_ranks)));
    written.insert("tiktoken.model");
    written.insert("tokenizer_config.json");
  }
  // What the previous checkpoint left and this one does not replace (an index and its shards
  // after a single-file model, model.safetensors after a sharded one, shards of another count,
  // a tokenizer this preset has none of): the loader would read those instead of the new files.
  // Removed before the config, which is written last, completes the new model.
  written.insert("config.json");
  for (const std::string& f : owned) {
    if (written.count(f)) continue;
    if (!fs::remove(dir / f, ec) || ec)
      return Status(ErrorCode::kIoError, (dir / f).string() +
                                             ": cannot remove the previous checkpoint's file: " +
                                             (ec ? ec.message() : "it vanished"));
    report.removed.push_back(f);
  }
  ATTNRES_RETURN_IF_ERROR(write_file_atomic(config_path, config_text));
  return report;
}

}  // namespace attnres
