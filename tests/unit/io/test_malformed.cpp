// Malformed-input suite: each case builds one broken input in a temp dir (a golden file with
// exactly one thing changed, or raw bytes) and asserts the exact error class and that the
// message names the offending file, tensor or field.
#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "io/weights.h"
#include "io_test_util.h"

namespace attnres {
namespace {

using namespace attnres::testing;
using nlohmann::json;

const std::string kQProj = std::string(kLm) + "layers.1.self_attn.q_proj.weight";

// Loads the model in `dir` and checks the error class and that every `needle` is in the message.
void expect_load_error(const TempDir& dir, ErrorCode code, std::vector<std::string> needles) {
  auto w = load_model(dir.path());
  ASSERT_FALSE(w.is_ok()) << "expected " << error_code_name(code);
  const Status& s = w.status();
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const std::string& n : needles)
    EXPECT_NE(s.message().find(n), std::string::npos) << "'" << n << "' not in: " << s.message();
}

// A raw file as model.safetensors next to tiny-a's config.
void raw_model(const TempDir& dir, const std::string& bytes) {
  fs::copy_file(golden_dir("tiny-a") + "/config.json", dir.file("config.json"));
  write_bytes(dir.file("model.safetensors"), bytes);
}

TEST(Malformed, TruncatedFile) {
  TempDir dir;
  const std::string full = read_bytes(golden_dir("tiny-a") + "/model.safetensors");
  raw_model(dir, full.substr(0, full.size() / 2));
  // The file ends inside the data section: the first tensor past the cut is named.
  expect_load_error(dir, ErrorCode::kTruncated,
                    {"model.safetensors", "truncated", std::to_string(full.size() / 2)});
}

TEST(Malformed, FileShorterThanLengthField) {
  TempDir dir;
  raw_model(dir, std::string("\x10\0\0", 3));
  expect_load_error(dir, ErrorCode::kTruncated, {"model.safetensors", "8 bytes"});
}

TEST(Malformed, EmptyFile) {
  TempDir dir;
  raw_model(dir, "");
  expect_load_error(dir, ErrorCode::kTruncated, {"model.safetensors"});
}

TEST(Malformed, HeaderLengthPastEndOfFile) {
  TempDir dir;
  const std::string full = read_bytes(golden_dir("tiny-a") + "/model.safetensors");
  raw_model(dir, full.substr(0, 1000));  // cut inside the 204512-byte header
  expect_load_error(dir, ErrorCode::kTruncated, {"model.safetensors", "header length 204512"});
}

TEST(Malformed, HeaderLengthNotSane) {
  TempDir dir;
  raw_model(dir, le64_bytes(1ULL << 40) + "{}");
  expect_load_error(dir, ErrorCode::kBadHeader, {"model.safetensors", "header length"});
}

TEST(Malformed, BadJson) {
  TempDir dir;
  const std::string hdr = R"({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})";
  raw_model(dir, le64_bytes(hdr.size()) + hdr + std::string(4, '\0'));  // one '}' short
  expect_load_error(dir, ErrorCode::kBadJson, {"model.safetensors", "JSON"});
}

TEST(Malformed, HeaderNotAnObject) {
  TempDir dir;
  const std::string hdr = "[1, 2, 3]";
  raw_model(dir, le64_bytes(hdr.size()) + hdr);
  expect_load_error(dir, ErrorCode::kBadHeader, {"model.safetensors", "array"});
}

TEST(Malformed, UnknownDtype) {
  TempDir dir;
  golden_with_header_edit("tiny-a", dir.path(), [](json& h) { h[kQProj]["dtype"] = "BF17"; });
  expect_load_error(dir, ErrorCode::kUnknownDtype, {kQProj, "BF17"});
}

TEST(Malformed, ShapeSizeMismatch) {
  TempDir dir;
  golden_with_header_edit("tiny-a", dir.path(), [](json& h) { h[kQProj]["shape"] = {192, 64}; });
  // [192, 64] x BF16 = 24576 bytes, range holds 49152.
  expect_load_error(dir, ErrorCode::kSizeMismatch, {kQProj, "[192, 64]", "24576", "49152"});
}

TEST(Malformed, ShapeOverflow) {
  TempDir dir;
  golden_with_header_edit("tiny-a", dir.path(), [](json& h) {
    h[kQProj]["shape"] = {1ULL << 62, 1ULL << 62};
  });
  expect_load_error(dir, ErrorCode::kSizeMismatch, {kQProj, "overflows"});
}

TEST(Malformed, NegativeShape) {
  TempDir dir;
  golden_with_header_edit("tiny-a", dir.path(), [](json& h) { h[kQProj]["shape"] = {-192, 128}; });
  expect_load_error(dir, ErrorCode::kBadHeader, {kQProj, "-192"});
}

TEST(Malformed, OffsetsBeginAfterEnd) {
  TempDir dir;
  golden_with_header_edit("tiny-a", dir.path(), [](json& h) {
    const uint64_t b = h[kQProj]["data_offsets"][0], e = h[kQProj]["data_offsets"][1];
    h[kQProj]["data_offsets"] = {e, b};
    h[kQProj]["shape"] = {0};
  });
  expect_load_error(dir, ErrorCode::kBadHeader, {kQProj, "begin > end"});
}

TEST(Malformed, OverlappingRanges) {
  TempDir dir;
  const std::string k = std::string(kLm) + "layers.1.self_attn.k_proj.weight";
  golden_with_header_edit("tiny-a", dir.path(), [&](json& h) {
    // Same size, moved onto q_proj's bytes shifted by 2: overlaps q_proj.
    const uint64_t b = h[kQProj]["data_offsets"][0], e = h[kQProj]["data_offsets"][1];
    h[k]["data_offsets"] = {b + 2, e + 2};
  });
  expect_load_error(dir, ErrorCode::kOverlap, {kQProj, k});
}

TEST(Malformed, RangeOutsideFile) {
  TempDir dir;
  golden_with_header_edit("tiny-a", dir.path(), [](json& h) {
    const uint64_t n = 192 * 128 * 2;
    h[kQProj]["data_offsets"] = {1ULL << 40, (1ULL << 40) + n};
  });
  expect_load_error(dir, ErrorCode::kOutOfRange, {kQProj, "1099511627776"});
}

TEST(Malformed, MetadataNotStrings) {
  TempDir dir;
  golden_with_header_edit("tiny-a", dir.path(), [](json& h) { h["__metadata__"]["seed"] = 1001; });
  expect_load_error(dir, ErrorCode::kBadHeader, {"__metadata__", "seed"});
}

TEST(Malformed, MissingTensor) {
  TempDir dir;
  const std::string name = std::string(kLm) + "layers.7.block_sparse_moe.experts.5.w3.weight_scale";
  golden_with_header_edit("tiny-a", dir.path(), [&](json& h) { h.erase(name); });
  expect_load_error(dir, ErrorCode::kMissingTensor, {name});
}

TEST(Malformed, MissingTensorNamedInTheFilesSpelling) {
  TempDir dir;
  // Names without the `language_model.` prefix: the missing one is named the same way.
  golden_with_header_edit("tiny-a", dir.path(), [](json& h) {
    json out = json::object();
    for (auto& [k, v] : h.items()) out[k.starts_with("language_model.") ? k.substr(15) : k] = v;
    out.erase("model.layers.2.self_attn.dt_bias");
    h = out;
  });
  expect_load_error(dir, ErrorCode::kMissingTensor, {"'model.layers.2.self_attn.dt_bias'"});
}

TEST(Malformed, AllMissingTensorsListed) {
  TempDir dir;
  const std::string a = std::string(kLm) + "norm.weight";
  const std::string b = std::string(kLm) + "layers.12.mlp_res_proj.weight";
  golden_with_header_edit("tiny-a", dir.path(), [&](json& h) {
    h.erase(a);
    h.erase(b);
  });
  expect_load_error(dir, ErrorCode::kMissingTensor, {"2 weight problems", a, b});
}

TEST(Malformed, WrongShape) {
  TempDir dir;
  // Same bytes, transposed shape: the header is valid, the config disagrees.
  golden_with_header_edit("tiny-a", dir.path(), [](json& h) { h[kQProj]["shape"] = {128, 192}; });
  expect_load_error(dir, ErrorCode::kShapeMismatch, {kQProj, "[128, 192]", "expected [192, 128]"});
}

TEST(Malformed, WrongALogShape) {
  TempDir dir;
  const std::string name = std::string(kLm) + "layers.0.self_attn.A_log";
  golden_with_header_edit("tiny-a", dir.path(), [&](json& h) { h[name]["shape"] = {2, 24}; });
  expect_load_error(dir, ErrorCode::kShapeMismatch, {name, "[2, 24]", "[1, 1, 4, 1]"});
}

TEST(Malformed, WrongExpertPackedShape) {
  TempDir dir;
  const std::string name =
      std::string(kLm) + "layers.2.block_sparse_moe.experts.0.w2.weight_packed";
  golden_with_header_edit("tiny-a", dir.path(), [&](json& h) { h[name]["shape"] = {48, 64}; });
  expect_load_error(dir, ErrorCode::kShapeMismatch, {name, "[48, 64]", "expected [64, 48]"});
}

TEST(Malformed, WrongDtype) {
  TempDir dir;
  // BF16 -> F16 keeps the byte count: only the dtype is wrong for the model.
  golden_with_header_edit("tiny-a", dir.path(), [](json& h) { h[kQProj]["dtype"] = "F16"; });
  expect_load_error(dir, ErrorCode::kDtypeMismatch, {kQProj, "F16", "BF16 or F32"});
}

TEST(Malformed, WrongExpertDtype) {
  TempDir dir;
  const std::string name = std::string(kLm) + "layers.4.block_sparse_moe.experts.9.w1.weight_scale";
  golden_with_header_edit("tiny-a", dir.path(), [&](json& h) { h[name]["dtype"] = "I8"; });
  expect_load_error(dir, ErrorCode::kDtypeMismatch, {name, "I8", "U8"});
}

TEST(Malformed, SameWeightUnderTwoPrefixes) {
  TempDir dir;
  const std::string name = std::string(kLm) + "norm.weight";
  fs::copy_file(golden_dir("tiny-a") + "/config.json", dir.file("config.json"));
  RawSafetensors r = RawSafetensors::load(golden_dir("tiny-a") + "/model.safetensors");
  // A second copy of the final norm, spelled without the prefixes, in its own bytes.
  const uint64_t end = r.data.size();
  r.header["model.norm.weight"] = {
      {"dtype", "BF16"}, {"shape", {128}}, {"data_offsets", {end, end + 256}}};
  r.data.append(256, '\0');
  r.save(dir.file("model.safetensors"));
  expect_load_error(dir, ErrorCode::kInconsistent, {"model.norm.weight", name});
}

TEST(Malformed, MissingConfigField) {
  TempDir dir;
  golden_with_config_edit("tiny-a", dir.path(),
                          [](json& c) { c["text_config"].erase("hidden_size"); });
  expect_load_error(dir, ErrorCode::kMissingField, {"config.json", "text_config.hidden_size"});
}

TEST(Malformed, WrongConfigFieldType) {
  TempDir dir;
  golden_with_config_edit("tiny-a", dir.path(),
                          [](json& c) { c["text_config"]["num_hidden_layers"] = "13"; });
  expect_load_error(dir, ErrorCode::kWrongType, {"config.json", "num_hidden_layers", "string"});
}

TEST(Malformed, LayerInBothLists) {
  TempDir dir;
  golden_with_config_edit("tiny-a", dir.path(), [](json& c) {
    c["text_config"]["linear_attn_config"]["kda_layers"].push_back(4);  // also a full_attn layer
  });
  expect_load_error(dir, ErrorCode::kInconsistent, {"config.json", "kda_layers", "layer 4"});
}

TEST(Malformed, ZeroBasedLayerList) {
  TempDir dir;
  golden_with_config_edit("tiny-a", dir.path(), [](json& c) {
    json& lac = c["text_config"]["linear_attn_config"];
    for (json& v : lac["full_attn_layers"]) v = v.get<int>() - 1;
    for (json& v : lac["kda_layers"]) v = v.get<int>() - 1;
  });
  expect_load_error(dir, ErrorCode::kInconsistent, {"config.json", "contains 0", "1-based"});
}

TEST(Malformed, ConfigDisagreesWithWeights) {
  TempDir dir;
  // A valid config whose head count no longer matches the stored KDA projections.
  golden_with_config_edit("tiny-a", dir.path(),
                          [](json& c) { c["text_config"]["linear_attn_config"]["num_heads"] = 8; });
  expect_load_error(dir, ErrorCode::kShapeMismatch, {"q_proj.weight", "expected [384, 128]"});
}

// Writes a 2-shard index over tiny-a where `edit` can break the weight map.
void sharded_model(const TempDir& dir, const std::function<void(json&)>& edit) {
  fs::copy_file(golden_dir("tiny-a") + "/config.json", dir.file("config.json"));
  auto src = SafetensorsFile::open(golden_dir("tiny-a") + "/model.safetensors").value();
  std::vector<TensorToWrite> s1, s2;
  json wm = json::object();
  for (size_t i = 0; i < src->entries().size(); ++i) {
    const SafetensorsEntry& e = src->entries()[i];
    (i % 2 ? s2 : s1).push_back(tensor_to_write(src->view(e)));
    wm[e.name] = i % 2 ? "b.safetensors" : "a.safetensors";
  }
  ASSERT_TRUE(write_safetensors(dir.file("a.safetensors"), s1).is_ok());
  ASSERT_TRUE(write_safetensors(dir.file("b.safetensors"), s2).is_ok());
  json index = {{"weight_map", wm}};
  edit(index);
  write_bytes(dir.file("model.safetensors.index.json"), index.dump());
}

TEST(Malformed, ShardIndexNamesMissingFile) {
  TempDir dir;
  sharded_model(dir, [](json& idx) { idx["weight_map"][kQProj] = "c.safetensors"; });
  expect_load_error(dir, ErrorCode::kIoError, {"model.safetensors.index.json", "c.safetensors"});
}

TEST(Malformed, ShardLacksMappedTensor) {
  TempDir dir;
  sharded_model(dir, [](json& idx) {
    const std::string s = idx["weight_map"][kQProj];
    idx["weight_map"][kQProj] = s == "a.safetensors" ? "b.safetensors" : "a.safetensors";
  });
  expect_load_error(dir, ErrorCode::kMissingTensor, {kQProj, "does not contain it"});
}

TEST(Malformed, ShardIndexBadJson) {
  TempDir dir;
  sharded_model(dir, [](json&) {});
  write_bytes(dir.file("model.safetensors.index.json"), "{\"weight_map\": {");
  expect_load_error(dir, ErrorCode::kBadJson, {"model.safetensors.index.json"});
}

TEST(Malformed, NoCheckpointInDirectory) {
  TempDir dir;
  fs::copy_file(golden_dir("tiny-a") + "/config.json", dir.file("config.json"));
  expect_load_error(dir, ErrorCode::kIoError, {dir.path(), "model.safetensors"});
}

// Hostile config values found by fuzz_config: errors (or a valid load), never UB or a huge
// allocation. These run under UBSan in CI.

TEST(MalformedConfig, HugeLayerCountIsInvalidNotAnAllocation) {
  TempDir dir;
  golden_with_config_edit("tiny-a", dir.path(),
                          [](json& c) { c["text_config"]["num_hidden_layers"] = 2000000000; });
  expect_load_error(dir, ErrorCode::kInvalidValue, {"num_hidden_layers", "2000000000"});
}

// Head dims are bounded at load (config.h), so H x (nope + rope) cannot overflow: a value past
// the bound is refused naming it, and one at the bound is a plain shape mismatch.
TEST(MalformedConfig, HeadDimBeyondTheBoundIsRefusedAtTheBoundAShapeError) {
  TempDir dir;
  golden_with_config_edit("tiny-a", dir.path(), [](json& c) {
    c["text_config"]["qk_nope_head_dim"] = 2147483647;
    c["text_config"]["qk_rope_head_dim"] = 10;
  });
  expect_load_error(dir, ErrorCode::kInvalidValue,
                    {"qk_nope_head_dim' is 2147483647, expected 0..1048576"});
  TempDir at_bound;
  golden_with_config_edit("tiny-a", at_bound.path(), [](json& c) {
    c["text_config"]["qk_nope_head_dim"] = 1048576;
    c["text_config"]["qk_rope_head_dim"] = 10;
  });
  // 4 heads x (1048576 + 10) rows.
  expect_load_error(at_bound, ErrorCode::kShapeMismatch, {"q_b_proj.weight", "4194344"});
}

TEST(MalformedConfig, HugeBlockSizeIsOneBankSlot) {
  const std::string text = read_bytes(golden_dir("tiny-a") + "/config.json");
  json cfg = json::parse(text);
  cfg["text_config"]["attn_res_block_size"] = 2147483647;
  auto c = parse_model_config(cfg.dump(), "big-block.json");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  EXPECT_EQ(c->schedule.bank_slots, 1);
  EXPECT_EQ(c->schedule.commit_layers, std::vector<int>{0});
}

}  // namespace
}  // namespace attnres
