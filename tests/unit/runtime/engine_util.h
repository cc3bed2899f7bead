// Shared helpers of the engine tests: golden models behind the public Model API, running
// requests through an Engine, and a model-level replay of a sequence with explicit segment cuts
// (what "a fresh run split at the same positions" means).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../model/golden_util.h"
#include "attnres/engine.h"

namespace attnres::testing {

inline std::shared_ptr<const Model> golden_model(const std::string& set) {
  static std::map<std::string, std::shared_ptr<const Model>> models;
  auto it = models.find(set);
  if (it != models.end()) return it->second;
  ModelLoadOptions o;
  o.dir = golden_dir(set);
  o.require_tokenizer = false;
  auto m = Model::load(o);
  EXPECT_TRUE(m.is_ok()) << m.status().to_string();
  if (!m.is_ok()) return nullptr;
  return models[set] = *m;
}

struct Outcome {
  GenerationResult result;
  std::vector<int64_t> prefill_marks;  // prompt positions reached after each prefill chunk
  bool finished = false;
};

inline GenerationCallbacks record_into(Outcome& o) {
  GenerationCallbacks cb;
  cb.on_finish = [&o](GenerationResult&& r) {
    o.result = std::move(r);
    o.finished = true;
  };
  cb.on_prefill = [&o](int64_t done, int64_t) { o.prefill_marks.push_back(done); };
  return cb;
}

// Runs every request through one engine; `stagger` submits them at random steps instead of
// all at once.
inline std::vector<Outcome> run_requests(std::shared_ptr<const Model> model,
                                         const EngineOptions& opt,
                                         const std::vector<GenerationRequest>& reqs,
                                         bool stagger = false, uint32_t seed = 1) {
  auto e = Engine::create(model, opt);
  EXPECT_TRUE(e.is_ok()) << e.status().to_string();
  std::vector<Outcome> out(reqs.size());
  if (!e.is_ok()) return out;
  std::mt19937 rng(seed);
  size_t next = 0;
  while (next < reqs.size() || (*e)->has_work()) {
    const size_t submit = stagger ? std::min(reqs.size() - next, size_t{rng() % 3}) : reqs.size();
    for (size_t k = 0; k < submit && next < reqs.size(); ++k, ++next) {
      auto id = (*e)->submit(reqs[next], record_into(out[next]));
      EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    }
    Status st = (*e)->step();
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
  }
  return out;
}

// One sequence through PlannedForward with explicit segments: `tokens` cut at `cuts`
// (increasing, the last == tokens.size()); the logits of row `rows[i]` (a position) for each.
inline std::vector<float> replay(const ModelWeights& w, const ForwardOptions& opt,
                                 const std::vector<int32_t>& tokens,
                                 const std::vector<int64_t>& cuts,
                                 const std::vector<int64_t>& rows) {
  const int64_t V = w.config.vocab_size;
  auto pf = PlannedForward::create(w, opt.act, 1024);
  EXPECT_TRUE(pf.is_ok());
  TestSequence seq(w.config, opt.cache_dtype(), 64);
  Arena arena;
  std::vector<float> out;
  int64_t begin = 0;
  for (int64_t end : cuts) {
    const Segment s{&seq.state, 0, end - begin};
    std::vector<int64_t> want;
    for (int64_t r : rows)
      if (r >= begin && r < end) want.push_back(r - begin);
    EXPECT_TRUE(reserve_segments(Segments(&s, 1)).is_ok());
    std::vector<float> lg(want.size() * static_cast<size_t>(V));
    Status st = (*pf)->run(Segments(&s, 1), opt, arena, tokens.data() + begin, want, lg.data());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    out.insert(out.end(), lg.begin(), lg.end());
    begin = end;
  }
  return out;
}

inline ForwardOptions forward_options(const EngineOptions& e) {
  ForwardOptions f;
  f.act = e.activation == ActivationType::kF32 ? ActDType::kF32 : ActDType::kBF16;
  f.kv = e.cache == CacheType::kFP8    ? KvCacheDtype::kFP8
         : e.cache == CacheType::kBF16 ? KvCacheDtype::kBF16
         : e.cache == CacheType::kF32  ? KvCacheDtype::kF32
                                       : KvCacheDtype::kAuto;
  f.kda_chunk = e.kda_chunk;
  return f;
}

}  // namespace attnres::testing
