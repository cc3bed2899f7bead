// Weight binding on the golden tiny models: zero missing tensors, shapes by formula, AttnRes
// queries folded in fp32, A_log layouts, plain-residual and dense-expert variants.
#include <gtest/gtest.h>

#include <cstring>

#include "io/safetensors.h"
#include "io/weights.h"
#include "io_test_util.h"
#include "util/mxfp4_lanes.h"

namespace attnres {
namespace {

using namespace attnres::testing;

using Shape = std::vector<int64_t>;

TEST(Weights, GoldenModelsBindEveryTensor) {
  for (const char* name : {"tiny-a", "tiny-b"}) {
    auto w = load_model(golden_dir(name));
    ASSERT_TRUE(w.is_ok()) << name << ": " << w.status().to_string();
    const BindReport& r = w->report;
    EXPECT_GT(r.tensors_in_files, 1000) << name;
    EXPECT_EQ(r.tensors_bound, r.tensors_in_files) << name;
    EXPECT_EQ(r.extra_tensors, 0) << name;
    EXPECT_EQ(w->layers.size(), static_cast<size_t>(w->config.num_hidden_layers));
    EXPECT_EQ(w->files.size(), 1u);
    EXPECT_GT(r.params_by_dtype.at("U8"), 0);
    int64_t bytes = 0;
    for (const auto& [dt, b] : r.bytes_by_dtype) bytes += b;
    // Every byte of the data section belongs to a bound tensor.
    EXPECT_EQ(bytes + static_cast<int64_t>(w->files[0]->header().data_offset), r.bytes_mapped);
  }
}

TEST(Weights, TinyAShapesFollowTheConfig) {
  auto w = load_model(golden_dir("tiny-a"));
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  // tiny-a: d 128, V 512, KDA 4 x 48, MLA 4 heads (32 + 16, v 48), q_lora 96, kv_lora 64,
  // 16 experts, I 96, latent 64, 2 shared experts.
  EXPECT_EQ(w->embed.shape, (Shape{512, 128}));
  EXPECT_EQ(w->lm_head.shape, (Shape{512, 128}));
  EXPECT_NE(w->lm_head.data, w->embed.data);  // untied
  const LayerWeights& l0 = w->layers[0];
  ASSERT_TRUE(l0.kda && l0.dense && !l0.mla && !l0.moe);
  EXPECT_EQ(l0.kda->q_proj.shape, (Shape{192, 128}));
  EXPECT_EQ(l0.kda->q_conv.shape, (Shape{192, 1, 4}));
  EXPECT_EQ(l0.kda->q_conv.dtype, DType::kF32);
  EXPECT_EQ(l0.kda->f_a_proj.shape, (Shape{48, 128}));
  EXPECT_EQ(l0.kda->g_proj.shape, (Shape{192, 128}));
  EXPECT_EQ(l0.kda->o_norm.shape, (Shape{48}));
  EXPECT_EQ(l0.kda->a_log.size(), 4u);
  EXPECT_EQ(l0.dense->down.shape, (Shape{128, 320}));
  const LayerWeights& l3 = w->layers[3];
  ASSERT_TRUE(l3.mla && l3.moe);
  EXPECT_EQ(l3.mla->q_b_proj.shape, (Shape{192, 96}));
  EXPECT_EQ(l3.mla->kv_a_proj.shape, (Shape{80, 128}));
  EXPECT_EQ(l3.mla->kv_b_proj.shape, (Shape{320, 64}));
  EXPECT_EQ(l3.mla->g_proj.shape, (Shape{192, 128}));
  ASSERT_EQ(l3.moe->experts.size(), 16u);
  const ExpertWeights& x = l3.moe->experts[15];
  EXPECT_TRUE(x.w1.mxfp4);
  EXPECT_EQ(x.w1.rows, 96);
  EXPECT_EQ(x.w1.cols, 64);
  EXPECT_EQ(x.w1.packed.shape, (Shape{96, 32}));
  EXPECT_EQ(x.w1.scale.shape, (Shape{96, 2}));
  EXPECT_EQ(x.w2.packed.shape, (Shape{64, 48}));
  EXPECT_EQ(x.w2.scale.shape, (Shape{64, 3}));
  // Read into private memory, codes and scales whose rows fill 16-row groups are stored in lane
  // groups (util/mxfp4_lanes.h), each element where the layout puts it.
  for (const ExpertMatrix* m : {&x.w1, &x.w2}) {
    EXPECT_EQ(m->packed.layout, Layout::kMxfp4Lanes);
    EXPECT_EQ(m->scale.layout, Layout::kMxfp4Lanes);
  }
  auto f = SafetensorsFile::open(golden_dir("tiny-a") + "/model.safetensors");
  ASSERT_TRUE(f.is_ok());
  // normal_scales: none of the matrix's scale bytes, as the file holds them, is 0 or 255 (none
  // of tiny-a's is; ExpertScaleBytesZeroAnd255AreNotNormal has some); a mapped matrix, never
  // read whole, claims nothing.
  auto mapped = load_model(golden_dir("tiny-a"), {}, WeightResidence::kMapped);
  ASSERT_TRUE(mapped.is_ok()) << mapped.status().to_string();
  int normal = 0;
  for (size_t e = 0; e < l3.moe->experts.size(); ++e)
    for (const char* which : {"w1", "w2", "w3"}) {
      const std::string name = std::string(kLm) + "layers.3.block_sparse_moe.experts." +
                               std::to_string(e) + "." + which + ".weight_scale";
      const TensorView file_scales = (*f)->tensor(name).value();
      const bool want =
          mxfp4_scales_normal(file_scales.as<uint8_t>(), static_cast<int64_t>(file_scales.nbytes));
      const ExpertWeights& ew = l3.moe->experts[e];
      const ExpertMatrix& m = which[1] == '1' ? ew.w1 : which[1] == '2' ? ew.w2 : ew.w3;
      EXPECT_EQ(m.normal_scales, want) << name;
      normal += want ? 1 : 0;
      const ExpertWeights& me = mapped->layers[3].moe->experts[e];
      EXPECT_FALSE((which[1] == '1' ? me.w1 : which[1] == '2' ? me.w2 : me.w3).normal_scales);
    }
  EXPECT_GT(normal, 0);
  const std::string w2 = std::string(kLm) + "layers.3.block_sparse_moe.experts.15.w2.";
  const TensorView codes = (*f)->tensor(w2 + "weight_packed").value();
  const TensorView scales = (*f)->tensor(w2 + "weight_scale").value();
  for (int64_t n = 0; n < 64; ++n)
    for (int64_t k = 0; k < 96; ++k)
      ASSERT_EQ(mxfp4_lanes_get(x.w2.packed.as<uint8_t>(), x.w2.scale.as<uint8_t>(), n, k, 96),
                mxfp4_get(codes.as<uint8_t>() + n * 48, scales.as<uint8_t>() + n * 3, k))
          << n << ", " << k;
  EXPECT_EQ(l3.moe->shared_gate.shape, (Shape{192, 128}));
  EXPECT_EQ(l3.moe->latent_down.shape, (Shape{64, 128}));
  EXPECT_EQ(l3.moe->latent_norm.shape, (Shape{64}));
  EXPECT_EQ(l3.moe->gate_bias.dtype, DType::kF32);
}

TEST(Weights, QueriesFoldedInFp32AndALogTakesFirstHeads) {
  auto w = load_model(golden_dir("tiny-b"));
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  auto f = SafetensorsFile::open(golden_dir("tiny-b") + "/model.safetensors");
  ASSERT_TRUE(f.is_ok());
  auto t = [&](const std::string& n) { return (*f)->tensor(kLm + n).value(); };
  const int64_t d = w->config.hidden_size;
  auto expect_fold = [&](const std::vector<float>& q, const std::string& prefix) {
    const TensorView norm = t(prefix + "_norm.weight"), proj = t(prefix + "_proj.weight");
    ASSERT_EQ(q.size(), static_cast<size_t>(d)) << prefix;
    for (int64_t j = 0; j < d; ++j)
      ASSERT_EQ(q[static_cast<size_t>(j)], norm.get_f32(j) * proj.get_f32(j)) << prefix << " " << j;
  };
  expect_fold(w->out_res_query, "output_attn_res");
  expect_fold(w->layers[0].attn_res_query, "layers.0.self_attention_res");  // bound, unused
  expect_fold(w->layers[6].attn_res_query, "layers.6.self_attention_res");
  expect_fold(w->layers[9].mlp_res_query, "layers.9.mlp_res");
  // Not a trivial fold: the query differs from both factors somewhere.
  bool differs = false;
  const TensorView n = t("output_attn_res_norm.weight");
  for (int64_t j = 0; j < d; ++j)
    differs |= w->out_res_query[static_cast<size_t>(j)] != n.get_f32(j);
  EXPECT_TRUE(differs);

  const TensorView a = t("layers.0.self_attn.A_log");
  EXPECT_EQ(a.shape, (Shape{32}));  // padded to head_dim; 6 heads meaningful
  ASSERT_EQ(w->layers[0].kda->a_log.size(), 6u);
  for (int h = 0; h < 6; ++h) EXPECT_EQ(w->layers[0].kda->a_log[h], a.get_f32(h));
}

TEST(Weights, ALogAcceptsPlainAndLegacyShapes) {
  for (const Shape& shape : {Shape{4}, Shape{1, 1, 4, 1}}) {
    TempDir dir;
    // Rewrite layer 0's A_log [48] as `shape` over its first 4 entries (the data stays in place:
    // the file then has a 176-byte gap, which is legal).
    golden_with_header_edit("tiny-a", dir.path(), [&](nlohmann::json& h) {
      auto& e = h[std::string(kLm) + "layers.0.self_attn.A_log"];
      const uint64_t b = e["data_offsets"][0];
      e["shape"] = shape;
      e["data_offsets"] = {b, b + 16};
    });
    auto w = load_model(dir.path());
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    auto g = load_model(golden_dir("tiny-a"));
    ASSERT_TRUE(g.is_ok());
    EXPECT_EQ(w->layers[0].kda->a_log, g->layers[0].kda->a_log);
  }
}

// An expert matrix with a scale byte 0 (2^-127) or 255 (NaN) is loaded with normal_scales false,
// so its kernels keep those bytes' special cases; the other matrices are normal.
TEST(Weights, ExpertScaleBytesZeroAnd255AreNotNormal) {
  TempDir dir;
  fs::copy_file(golden_dir("tiny-a") + "/config.json", dir.file("config.json"));
  RawSafetensors r = RawSafetensors::load(golden_dir("tiny-a") + "/model.safetensors");
  const std::string e = std::string(kLm) + "layers.3.block_sparse_moe.experts.";
  const auto set_byte = [&](const std::string& name, int64_t at, char b) {
    const int64_t begin = r.header.at(name).at("data_offsets")[0].get<int64_t>();
    r.data[static_cast<size_t>(begin + at)] = b;
  };
  set_byte(e + "5.w2.weight_scale", 77, '\x00');
  set_byte(e + "6.w3.weight_scale", 0, '\xff');
  r.save(dir.file("model.safetensors"));
  auto w = load_model(dir.path());
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const std::vector<ExpertWeights>& x = w->layers[3].moe->experts;
  EXPECT_FALSE(x[5].w2.normal_scales);
  EXPECT_FALSE(x[6].w3.normal_scales);
  EXPECT_TRUE(x[5].w1.normal_scales);
  EXPECT_TRUE(x[5].w3.normal_scales);
  EXPECT_TRUE(x[6].w1.normal_scales);
  EXPECT_TRUE(x[6].w2.normal_scales);
  EXPECT_TRUE(x[7].w2.normal_scales);
}

// A config without attn_res_block_size is a plain residual model: it needs no res tensors, and
// those present in the file are counted as extra, not bound.
TEST(Weights, PlainResidualConfigNeedsNoResTensors) {
  TempDir dir;
  golden_with_config_edit("tiny-a", dir.path(),
                          [](nlohmann::json& c) { c["text_config"].erase("attn_res_block_size"); });
  auto w = load_model(dir.path());
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_TRUE(w->out_res_query.empty());
  EXPECT_TRUE(w->layers[4].attn_res_query.empty());
  // 4 res tensors per layer (13 layers) + the 2 output ones.
  EXPECT_EQ(w->report.extra_tensors, 13 * 4 + 2);
  EXPECT_EQ(w->report.extra_examples.size(), 5u);
  EXPECT_NE(w->report.extra_examples[0].find("_res_"), std::string::npos);
}

// Without quantization_config the routed experts are dense `experts.{e}.w{1,2,3}.weight`.
// Build that checkpoint by dequantising tiny-a's MXFP4 experts to F32.
TEST(Weights, DenseExpertsWhenNotQuantized) {
  TempDir dir;
  nlohmann::json cfg = nlohmann::json::parse(read_bytes(golden_dir("tiny-a") + "/config.json"));
  cfg["text_config"].erase("quantization_config");
  write_bytes(dir.file("config.json"), cfg.dump());
  auto src = SafetensorsFile::open(golden_dir("tiny-a") + "/model.safetensors");
  ASSERT_TRUE(src.is_ok());
  std::vector<TensorToWrite> out;
  std::vector<std::vector<float>> dense;  // keeps dequantised data alive
  dense.reserve((*src)->entries().size());
  for (const SafetensorsEntry& e : (*src)->entries()) {
    const std::string& n = e.name;
    if (n.ends_with(".weight_scale")) continue;
    if (!n.ends_with(".weight_packed")) {
      out.push_back(tensor_to_write((*src)->view(e)));
      continue;
    }
    const std::string base = n.substr(0, n.size() - std::string(".weight_packed").size());
    const TensorView packed = (*src)->view(e);
    const TensorView scale = (*src)->tensor(base + ".weight_scale").value();
    const int64_t rows = packed.shape[0], cols = packed.shape[1] * 2;
    std::vector<float>& m = dense.emplace_back(static_cast<size_t>(rows * cols));  // [rows, cols]
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k)
        m[static_cast<size_t>(r * cols + k)] = mxfp4_get(packed.as<uint8_t>() + r * (cols / 2),
                                                         scale.as<uint8_t>() + r * (cols / 32), k);
    out.push_back({base + ".weight", DType::kF32, {rows, cols}, m.data()});
  }
  ASSERT_TRUE(write_safetensors(dir.file("model.safetensors"), out).is_ok());
  auto w = load_model(dir.path());
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  const ExpertMatrix& w2 = w->layers[2].moe->experts[3].w2;
  EXPECT_FALSE(w2.mxfp4);
  EXPECT_EQ(w2.dense.shape, (Shape{64, 96}));
  EXPECT_EQ(w2.dense.dtype, DType::kF32);
  EXPECT_EQ(w->report.extra_tensors, 0);
}

}  // namespace
}  // namespace attnres
