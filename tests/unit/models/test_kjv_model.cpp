// The committed KJV model (models/kjv, MXFP4 experts, and models/kjv-bf16-experts) against the
// trainer that made it (tools/train): logits, tokenizer and held-out loss.
//
// tests/fixtures/kjv/reference_logits.safetensors holds, per prompt, the ids and the logits of
// the trainer's own forward (tools/train/model.py) in float64 on exactly the values the engine
// computes with (bf16-rounded weights, dequantised MXFP4 experts), written by
// tools/train/export.py. So in f32 the engine may differ from them only by its f32 arithmetic:
// the bound is 2e-3 (issue 15), measured worst in the test output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "io/weights.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace attnres {
namespace {

const std::string kModels = std::string(ATTNRES_SOURCE_DIR) + "/models";
const std::string kFixture = std::string(ATTNRES_FIXTURES_DIR) + "/kjv/reference_logits";
const std::map<std::string, std::string> kVariants = {{"mxfp4", kModels + "/kjv"},
                                                      {"bf16", kModels + "/kjv-bf16-experts"}};

const ModelWeights& model(const std::string& variant) {
  static std::map<std::string, std::unique_ptr<ModelWeights>> loaded;
  auto& slot = loaded[variant];
  if (!slot) {
    auto w = load_model(kVariants.at(variant));
    EXPECT_TRUE(w.is_ok()) << w.status().to_string();
    slot = std::make_unique<ModelWeights>(w.is_ok() ? std::move(w).value() : ModelWeights{});
  }
  return *slot;
}

const nlohmann::json& manifest() {
  static const nlohmann::json j = [] {
    std::ifstream in(kFixture + ".json");
    EXPECT_TRUE(in.good()) << kFixture << ".json";
    return in.good() ? nlohmann::json::parse(in) : nlohmann::json::object();
  }();
  return j;
}

std::shared_ptr<const SafetensorsFile> cases() {
  static auto f = SafetensorsFile::open(kFixture + ".safetensors");
  EXPECT_TRUE(f.is_ok()) << f.status().to_string();
  return f.is_ok() ? f.value() : nullptr;
}

std::vector<int32_t> case_ids(int i) {
  auto t = cases()->tensor("case" + std::to_string(i) + ".prompt_ids");
  EXPECT_TRUE(t.is_ok());
  return std::vector<int32_t>(t.value().as<int32_t>(), t.value().as<int32_t>() + t.value().numel());
}

std::vector<float> session_logits(const ModelWeights& w, const std::vector<int32_t>& ids,
                                  ActDType act, int64_t chunk) {
  SessionOptions so;
  so.forward.act = act;
  so.chunk_size = chunk;
  auto s = Session::create(w, so);
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  std::vector<float> logits;
  Status st = (*s)->prefill(ids, /*all_logits=*/true, logits);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return logits;
}

int64_t num_cases() {
  return static_cast<int64_t>(manifest()["prompts"].size());
}

// f32 engine logits of every prompt row within 2e-3 of the trainer's, with the same greedy
// token on every row; one-shot prefill and one token per step (the decode path).
TEST(KjvModel, F32LogitsMatchTheTrainer) {
  ASSERT_GE(num_cases(), 3);
  for (const auto& [variant, dir] : kVariants) {
    const ModelWeights& w = model(variant);
    ASSERT_FALSE(w.layers.empty()) << dir;
    const int64_t V = w.config.vocab_size;
    for (int64_t chunk : {int64_t{4096}, int64_t{1}}) {
      double worst = 0;
      for (int64_t i = 0; i < num_cases(); ++i) {
        const std::vector<int32_t> ids = case_ids(static_cast<int>(i));
        auto ref = cases()->tensor("case" + std::to_string(i) + "." + variant + ".logits");
        ASSERT_TRUE(ref.is_ok()) << ref.status().to_string();
        ASSERT_EQ(ref.value().numel(), static_cast<int64_t>(ids.size()) * V);
        const std::vector<float> got = session_logits(w, ids, ActDType::kF32, chunk);
        const float* want = ref.value().as<float>();
        for (size_t t = 0; t < ids.size(); ++t) {
          const std::span<const float> g(got.data() + t * V, static_cast<size_t>(V));
          const std::span<const float> r(want + t * V, static_cast<size_t>(V));
          for (int64_t v = 0; v < V; ++v)
            worst = std::max(worst, static_cast<double>(std::fabs(g[v] - r[v])));
          EXPECT_EQ(argmax(g), argmax(r)) << variant << " case " << i << " row " << t;
        }
      }
      EXPECT_LE(worst, 2e-3) << variant << " chunk " << chunk;
      std::printf("[ measured ] %s experts, chunk %lld: worst |engine - trainer| = %.3g\n",
                  variant.c_str(), static_cast<long long>(chunk), worst);
    }
  }
}

// The engine's tokenizer gives the trainer's ids: on the prompts, and on the whole held-out
// text (count and FNV-1a hash of the ids as little-endian int32, written by export.py).
TEST(KjvModel, TokenizerMatchesTheTrainer) {
  auto tok = Tokenizer::load(kVariants.at("mxfp4") + "/tiktoken.model", PreTokenizer::kKimi);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  for (int64_t i = 0; i < num_cases(); ++i) {
    auto ids = tok->encode(manifest()["prompts"][static_cast<size_t>(i)].get<std::string>(),
                           /*allow_special=*/false);
    ASSERT_TRUE(ids.is_ok());
    EXPECT_EQ(ids.value(), case_ids(static_cast<int>(i))) << "prompt " << i;
  }
  std::ifstream in(kModels + "/kjv-heldout.txt", std::ios::binary);
  ASSERT_TRUE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  auto held = tok->encode(ss.str(), /*allow_special=*/false);
  ASSERT_TRUE(held.is_ok());
  EXPECT_EQ(static_cast<int64_t>(held->size()), manifest()["heldout_tokens"].get<int64_t>());
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : held.value())
    for (int b = 0; b < 4; ++b)
      h = (h ^ ((static_cast<uint32_t>(id) >> (8 * b)) & 0xff)) * 0x100000001b3ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  EXPECT_EQ(std::string(hex), manifest()["heldout_ids_fnv1a"].get<std::string>());
  // The control tokens sit after the ranks, as in Kimi-K3's layout.
  EXPECT_EQ(tok->special_id("<|end_of_msg|>"), model("mxfp4").config.eos_token_id.value_or(-1));
}

// The held-out loss of the first windows, as the trainer computed it (float64), is what the
// engine gets in f32 and, within bf16 rounding, in the default bf16 flow.
TEST(KjvModel, HeldOutLossMatchesTheTrainer) {
  auto tok = Tokenizer::load(kVariants.at("mxfp4") + "/tiktoken.model", PreTokenizer::kKimi);
  ASSERT_TRUE(tok.is_ok());
  std::ifstream in(kModels + "/kjv-heldout.txt", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<int32_t> held = tok->encode(ss.str(), false).value();
  const int64_t W = manifest()["heldout_window"].get<int64_t>();
  for (const auto& [variant, dir] : kVariants) {
    const ModelWeights& w = model(variant);
    const int64_t V = w.config.vocab_size;
    const auto& want = manifest()["heldout_window_nll"][variant];
    ASSERT_GE(want.size(), 2u);
    for (ActDType act : {ActDType::kF32, ActDType::kBF16}) {
      for (size_t k = 0; k < want.size(); ++k) {
        const std::vector<int32_t> ids(held.begin() + static_cast<int64_t>(k) * W,
                                       held.begin() + static_cast<int64_t>(k + 1) * W);
        const std::vector<float> logits = session_logits(w, ids, act, 4096);
        double nll = 0;
        for (int64_t t = 0; t + 1 < W; ++t) {
          const float* row = logits.data() + t * V;
          const double mx = *std::max_element(row, row + V);
          double sum = 0;
          for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
          nll += mx + std::log(sum) - row[ids[static_cast<size_t>(t + 1)]];
        }
        nll /= static_cast<double>(W - 1);
        const double ref = want[k].get<double>();
        std::printf("[ measured ] %s experts, %s, window %zu: engine %.6f, trainer %.6f\n",
                    variant.c_str(), act == ActDType::kF32 ? "f32" : "bf16", k, nll, ref);
        // f32: summation order only; bf16: the rounding of every activation (measured: at
        // most 1.1e-3 nats, 0.03%, on these windows; the bound leaves 20x).
        EXPECT_NEAR(nll, ref, act == ActDType::kF32 ? 1e-4 : 5e-3 * ref)
            << variant << (act == ActDType::kF32 ? " f32" : " bf16") << " window " << k;
      }
    }
  }
}

std::set<std::string> words_of(const std::string& text) {
  std::set<std::string> out;
  std::string w;
  for (char c : text + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      w += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!w.empty()) {
      out.insert(w);
      w.clear();
    }
  }
  return out;
}

// The quick start's generation (scripts/quickstart.sh: sampled, seeded) reads like the corpus:
// no control tokens, printable text, and nearly every word it writes is an English word of the
// Bible, judged against the held-out chapters' vocabulary (which the model never saw).
TEST(KjvModel, QuickStartTextReadsLikeTheCorpus) {
  const std::string cmd = std::string(ATTNRES_CLI_PATH) + " generate --model " +
                          kVariants.at("mxfp4") +
                          " --prompt 'And God said unto Moses,' --max-new-tokens 64"
                          " --temperature 0.7 --top-p 0.95 --seed 1 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  EXPECT_EQ(out.find("<|"), std::string::npos) << out;
  for (unsigned char c : out) EXPECT_TRUE(std::isprint(c) || std::isspace(c)) << out;
  std::ifstream in(kModels + "/kjv-heldout.txt", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::set<std::string> known = words_of(ss.str());
  int total = 0, found = 0;
  std::string w;
  for (char c : out + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      w += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!w.empty()) {
      ++total;
      found += known.count(w) ? 1 : 0;
      w.clear();
    }
  }
  ASSERT_GE(total, 30) << out;
  EXPECT_GE(found, 0.85 * total) << out;
  std::printf("[ measured ] %d of %d generated words occur in the held-out text\n", found, total);
}

}  // namespace
}  // namespace attnres
