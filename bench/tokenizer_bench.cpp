// Tokenizer and sampler speed: encoding MB/s on a large mixed corpus (the 2,300-string parity
// corpus of tests/fixtures/tokenizer: multilingual, CJK, emoji, code, whitespace runs, numbers;
// joined with newlines and repeated to ~4 MB), decoding MB/s, and one sampling step over
// Kimi-K3's vocabulary size. Single-threaded.
//   ./attnres_bench --benchmark_filter='Tokenizer|Sampl'
#include <benchmark/benchmark.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "kernels/sampling.h"
#include "tokenizer/tokenizer.h"

namespace attnres {
namespace {

const std::string kDir = std::string(ATTNRES_FIXTURES_DIR) + "/tokenizer";

const std::string& mixed_corpus() {
  static const std::string text = [] {
    std::ifstream in(kDir + "/corpus.json");
    std::stringstream ss;
    ss << in.rdbuf();
    const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
    std::string one;
    if (j.is_object())
      for (const auto& s : j["strings"]) one += s.get<std::string>() + "\n";
    std::string out;
    while (!one.empty() && out.size() < (4u << 20)) out += one;
    return out;
  }();
  return text;
}

const Tokenizer* tokenizer(PreTokenizer pre) {
  static std::map<int, Tokenizer> cache;
  auto it = cache.find(static_cast<int>(pre));
  if (it == cache.end()) {
    const std::string ranks = kDir + (pre == PreTokenizer::kCl100kBase ? "/cl100k_base.tiktoken"
                                                                       : "/o200k_base.tiktoken");
    auto t = Tokenizer::load(ranks, pre);
    if (!t) return nullptr;
    it = cache.emplace(static_cast<int>(pre), std::move(t).value()).first;
  }
  return &it->second;
}

// arg: PreTokenizer (0 kimi over the o200k ranks, 1 o200k_base, 2 cl100k_base).
void BM_TokenizerEncode(benchmark::State& state) {
  const auto pre = static_cast<PreTokenizer>(state.range(0));
  const Tokenizer* t = tokenizer(pre);
  const std::string& text = mixed_corpus();
  if (t == nullptr || text.empty()) {
    state.SkipWithError("tokenizer fixtures missing (tests/fixtures/tokenizer)");
    return;
  }
  std::vector<TokenId> ids;
  for (auto _ : state) {
    ids.clear();
    if (!t->encode_into(text, false, ids).is_ok()) {
      state.SkipWithError("encode failed");
      return;
    }
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(text.size()));
  state.counters["tokens"] = static_cast<double>(ids.size());
  state.counters["bytes/token"] =
      static_cast<double>(text.size()) / static_cast<double>(ids.size());
  state.SetLabel(std::string(pretokenizer_name(pre)));
}
BENCHMARK(BM_TokenizerEncode)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

void BM_TokenizerDecode(benchmark::State& state) {
  const Tokenizer* t = tokenizer(PreTokenizer::kO200kBase);
  const std::string& text = mixed_corpus();
  if (t == nullptr || text.empty()) {
    state.SkipWithError("tokenizer fixtures missing (tests/fixtures/tokenizer)");
    return;
  }
  const std::vector<TokenId> ids = *t->encode(text, false);
  for (auto _ : state) {
    auto s = t->decode(ids);
    benchmark::DoNotOptimize(s->data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(text.size()));
}
BENCHMARK(BM_TokenizerDecode)->Unit(benchmark::kMillisecond);

// One sampling step over Kimi-K3's 163,840 logits. arg 0: greedy; 1: T=0.7, top-p 0.9;
// 2: T=1, top-k 50; 3: T=1, no filter (the draw walks the whole vocabulary).
void BM_Sample(benchmark::State& state) {
  constexpr int64_t kVocab = 163840;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(kVocab);
  for (float& x : logits) x = normal(rng);
  std::vector<int32_t> history(2048);
  for (int32_t& h : history) h = static_cast<int32_t>(rng() % kVocab);
  SamplingParams p;
  switch (state.range(0)) {
    case 0:
      p.temperature = 0.0f;
      break;
    case 1:
      p.temperature = 0.7f;
      p.top_p = 0.9f;
      break;
    case 2:
      p.top_k = 50;
      break;
    default:
      break;
  }
  p.repetition_penalty = 1.1f;
  Sampler sampler(p, kVocab);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits, history));
}
BENCHMARK(BM_Sample)->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace attnres
