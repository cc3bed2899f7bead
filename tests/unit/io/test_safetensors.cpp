// Safetensors reader/writer: round trip, alignment, atomic replace, in-memory parsing, shards.
#include <gtest/gtest.h>

#include <cstring>

#include "io/safetensors.h"
#include "io/weights.h"
#include "io_test_util.h"

namespace attnres {
namespace {

using namespace attnres::testing;

std::span<const std::byte> as_span(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

TEST(Safetensors, WriterRoundTrip) {
  TempDir dir;
  const std::vector<uint8_t> u8 = {1, 2, 3};  // odd size: alignment test
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};  // [2, 3]
  const std::vector<uint16_t> bf = {0x3f80, 0x4000};                      // [2]
  const std::vector<int64_t> i64 = {-1, 1LL << 40};                       // [2]
  std::vector<TensorToWrite> ts = {
      {"a.u8", DType::kU8, {3}, u8.data()},      {"b.f32", DType::kF32, {2, 3}, f32.data()},
      {"c.bf16", DType::kBF16, {2}, bf.data()},  {"d.i64", DType::kI64, {2}, i64.data()},
      {"e.empty", DType::kF32, {0, 4}, nullptr}, {"f.scalar", DType::kF32, {}, f32.data()},
  };
  const std::string path = dir.file("rt.safetensors");
  ASSERT_TRUE(write_safetensors(path, ts, {{"format", "pt"}, {"note", "round trip"}}).is_ok());

  const std::string raw = read_bytes(path);
  EXPECT_EQ((8 + le64(raw)) % 8, 0u) << "data section must start on an 8-byte boundary";
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  const SafetensorsFile& file = **f;
  EXPECT_EQ(file.metadata().at("note"), "round trip");
  ASSERT_EQ(file.entries().size(), ts.size());
  for (const TensorToWrite& t : ts) {
    auto v = file.tensor(t.name);
    ASSERT_TRUE(v.is_ok()) << t.name;
    EXPECT_EQ(v->dtype, t.dtype) << t.name;
    EXPECT_EQ(v->shape, t.shape) << t.name;
    ASSERT_EQ(v->nbytes, static_cast<size_t>(v->numel()) * dtype_size(t.dtype)) << t.name;
    if (v->nbytes > 0) {
      EXPECT_EQ(std::memcmp(v->data, t.data, v->nbytes), 0) << t.name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data) % dtype_size(t.dtype), 0u) << t.name;
    }
  }
  EXPECT_FLOAT_EQ(file.tensor("b.f32")->get_f32(2), 3.25f);
  EXPECT_FLOAT_EQ(file.tensor("c.bf16")->get_f32(1), 2.0f);
  EXPECT_EQ(file.tensor("nope").status().code(), ErrorCode::kMissingTensor);
  // No temporary file left behind.
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++n;
  EXPECT_EQ(n, 1);
}

TEST(Safetensors, WriterRefusesBadInputAndKeepsExistingFile) {
  TempDir dir;
  const std::string path = dir.file("keep.safetensors");
  const float x = 1.0f;
  ASSERT_TRUE(write_safetensors(path, {{"x", DType::kF32, {1}, &x}}).is_ok());
  const std::string before = read_bytes(path);
  Status dup = write_safetensors(path, {{"y", DType::kF32, {1}, &x}, {"y", DType::kF32, {1}, &x}});
  EXPECT_EQ(dup.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(dup.message().find("'y'"), std::string::npos) << dup.message();
  Status neg = write_safetensors(path, {{"z", DType::kF32, {-1}, &x}});
  EXPECT_EQ(neg.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(read_bytes(path), before);
  // A directory that does not exist: an error, nothing created.
  Status nodir =
      write_safetensors(dir.file("missing/sub.safetensors"), {{"x", DType::kF32, {1}, &x}});
  EXPECT_EQ(nodir.code(), ErrorCode::kIoError);
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path())) ++n;
  EXPECT_EQ(n, 1);
}

TEST(Safetensors, ParsesFromMemory) {
  const std::string hdr =
      R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})";
  const std::string file = le64_bytes(hdr.size()) + hdr + std::string(8, '\0');
  auto h = parse_safetensors_header(as_span(file), "mem");
  ASSERT_TRUE(h.is_ok()) << h.status().to_string();
  ASSERT_EQ(h->tensors.size(), 1u);
  EXPECT_EQ(h->tensors[0].name, "t");
  EXPECT_EQ(h->data_offset, 8 + hdr.size());
  EXPECT_EQ(h->metadata.at("k"), "v");
  // The smallest legal file: an empty header object.
  const std::string empty = le64_bytes(2) + "{}";
  EXPECT_TRUE(parse_safetensors_header(as_span(empty), "mem").is_ok());
}

TEST(Safetensors, GoldenHeadersValidate) {
  for (const char* name : {"tiny-a", "tiny-b"}) {
    auto f = SafetensorsFile::open(golden_dir(name) + "/model.safetensors");
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    EXPECT_EQ((*f)->header().data_offset % 8, 0u);
    EXPECT_GT((*f)->entries().size(), 1000u);
  }
}

// Splits tiny-a into two shards plus an index; the second shard spells names without the
// `language_model.` prefix (prefix detection is per tensor). The sharded model must bind to the
// same bytes as the single file.
TEST(Safetensors, ShardedCheckpointBindsLikeSingleFile) {
  TempDir dir;
  fs::copy_file(golden_dir("tiny-a") + "/config.json", dir.file("config.json"));
  auto src = SafetensorsFile::open(golden_dir("tiny-a") + "/model.safetensors");
  ASSERT_TRUE(src.is_ok());
  const auto& entries = (*src)->entries();
  std::vector<TensorToWrite> shard[2];
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < entries.size(); ++i) {
    const int s = i < entries.size() / 2 ? 0 : 1;
    TensorToWrite t = tensor_to_write((*src)->view(entries[i]));
    if (s == 1 && t.name.starts_with("language_model.")) t.name = t.name.substr(15);
    const std::string file =
        s == 0 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
    weight_map[t.name] = file;
    shard[s].push_back(std::move(t));
  }
  ASSERT_TRUE(write_safetensors(dir.file("model-00001-of-00002.safetensors"), shard[0]).is_ok());
  ASSERT_TRUE(write_safetensors(dir.file("model-00002-of-00002.safetensors"), shard[1]).is_ok());
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
  write_bytes(dir.file("model.safetensors.index.json"), index.dump(1));

  auto sharded = load_model(dir.path());
  ASSERT_TRUE(sharded.is_ok()) << sharded.status().to_string();
  auto single = load_model(golden_dir("tiny-a"));
  ASSERT_TRUE(single.is_ok()) << single.status().to_string();
  EXPECT_EQ(sharded->files.size(), 2u);
  EXPECT_EQ(sharded->report.tensors_bound, single->report.tensors_bound);
  EXPECT_EQ(sharded->report.extra_tensors, 0);
  EXPECT_EQ(sharded->report.bytes_by_dtype, single->report.bytes_by_dtype);
  auto same = [](const TensorView& a, const TensorView& b) {
    return a.shape == b.shape && a.nbytes == b.nbytes && std::memcmp(a.data, b.data, a.nbytes) == 0;
  };
  EXPECT_TRUE(same(sharded->embed, single->embed));
  EXPECT_TRUE(same(sharded->lm_head, single->lm_head));
  const int L = single->config.num_hidden_layers;
  EXPECT_TRUE(same(sharded->layers[L - 1].mla->kv_b_proj, single->layers[L - 1].mla->kv_b_proj));
  EXPECT_TRUE(same(sharded->layers[5].moe->experts[7].w2.packed,
                   single->layers[5].moe->experts[7].w2.packed));
  EXPECT_EQ(sharded->out_res_query, single->out_res_query);
}

}  // namespace
}  // namespace attnres
