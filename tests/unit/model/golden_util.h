// Shared helpers of the model tests: the golden fixtures (tiny-a, tiny-b) loaded once per
// process, and small runners for prefill and teacher-forced decode.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "io/weights.h"
#include "model/forward.h"
#include "model/planned.h"
#include "model/reference.h"

namespace attnres::testing {

inline std::string golden_dir(const std::string& name) {
  return std::string(ATTNRES_FIXTURES_DIR) + "/golden/" + name;
}

struct GoldenSet {
  ModelWeights weights;
  std::shared_ptr<const SafetensorsFile> cases;
  std::shared_ptr<const SafetensorsFile> intermediates;  // tiny-a only
  int num_cases = 0;

  TensorView tensor(const std::string& name) const {
    auto r = cases->tensor(name);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return r.is_ok() ? r.value() : TensorView{};
  }
  std::vector<int32_t> ids(const std::string& name) const {
    TensorView t = tensor(name);
    std::vector<int32_t> v(static_cast<size_t>(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = t.as<int32_t>()[i];
    return v;
  }
  std::vector<float> floats(const std::string& name) const {
    TensorView t = tensor(name);
    return std::vector<float>(t.as<float>(), t.as<float>() + t.numel());
  }
};

// Loaded once per process (the weights are memory-mapped and immutable).
inline const GoldenSet& golden(const std::string& name) {
  static std::map<std::string, std::unique_ptr<GoldenSet>> sets;
  auto it = sets.find(name);
  if (it != sets.end()) return *it->second;
  auto set = std::make_unique<GoldenSet>();
  auto w = load_model(golden_dir(name));
  if (!w.is_ok()) {
    ADD_FAILURE() << "load_model(" << name << "): " << w.status().to_string();
  } else {
    set->weights = std::move(w).value();
  }
  auto cases = SafetensorsFile::open(golden_dir(name) + "/cases.safetensors");
  if (!cases.is_ok()) {
    ADD_FAILURE() << cases.status().to_string();
  } else {
    set->cases = cases.value();
    while (set->cases->contains("case" + std::to_string(set->num_cases) + ".prompt_ids"))
      ++set->num_cases;
  }
  auto inter = SafetensorsFile::open(golden_dir(name) + "/intermediates.safetensors");
  if (inter.is_ok()) set->intermediates = inter.value();
  return *sets.emplace(name, std::move(set)).first->second;
}

inline ForwardOptions f32_options() {
  ForwardOptions o;
  o.act = ActDType::kF32;
  return o;
}

// A sequence with a latent-cache pool of its own (small pages, so that tests cross page
// boundaries often).
struct TestSequence {
  KvPool pool;
  SequenceState state;
  TestSequence(const ModelConfig& c, KvCacheDtype dtype, int64_t page_tokens = 16)
      : pool(c, dtype, page_tokens), state(SequenceState::create(c, pool).value()) {}
};

// Prefill of `prompt` in chunks of `chunk` tokens (0 = one shot); logits of every row [T, V].
inline std::vector<float> prefill(const ModelWeights& w, const std::vector<int32_t>& prompt,
                                  const ForwardOptions& opt, SequenceState& state, Arena& arena,
                                  int64_t chunk = 0, const Misreadings& mis = {}) {
  const int64_t T = static_cast<int64_t>(prompt.size()), V = w.config.vocab_size;
  std::vector<float> logits(static_cast<size_t>(T * V));
  if (chunk <= 0) chunk = T;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    arena.reset();
    Status st = reference_forward(w, state, opt, arena, prompt.data() + t0, n, true,
                                  logits.data() + t0 * V, nullptr, mis);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  return logits;
}

inline std::vector<float> prefill(const ModelWeights& w, const std::vector<int32_t>& prompt,
                                  const ForwardOptions& opt, int64_t chunk = 0,
                                  const Misreadings& mis = {}) {
  TestSequence seq(w.config, opt.cache_dtype());
  Arena arena;
  return prefill(w, prompt, opt, seq.state, arena, chunk, mis);
}

// Teacher-forced decode: row 0 = last prefill row, row j = logits after feeding fed[j-1].
inline std::vector<float> decode_rows(const ModelWeights& w, const std::vector<int32_t>& prompt,
                                      const std::vector<int32_t>& fed, const ForwardOptions& opt) {
  const int64_t V = w.config.vocab_size, T = static_cast<int64_t>(prompt.size());
  TestSequence seq(w.config, opt.cache_dtype());
  SequenceState& state = seq.state;
  Arena arena;
  std::vector<float> pre = prefill(w, prompt, opt, state, arena);
  std::vector<float> rows(pre.end() - V, pre.end());
  for (size_t j = 0; j + 1 < fed.size(); ++j) {
    arena.reset();
    std::vector<float> row(static_cast<size_t>(V));
    Status st = reference_forward(w, state, opt, arena, &fed[j], 1, false, row.data());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    rows.insert(rows.end(), row.begin(), row.end());
  }
  (void)T;
  return rows;
}

inline float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}
inline float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  return max_abs_diff(a.data(), b.data(), std::min(a.size(), b.size()));
}

inline std::vector<int32_t> argmax_rows(const std::vector<float>& logits, int64_t V) {
  std::vector<int32_t> out;
  for (size_t r = 0; r * static_cast<size_t>(V) < logits.size(); ++r) {
    const float* row = logits.data() + r * static_cast<size_t>(V);
    int32_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (row[i] > row[best]) best = static_cast<int32_t>(i);
    out.push_back(best);
  }
  return out;
}

// Prefill (in chunks of `chunk`) then teacher-forced decode of `fed` through PlannedForward.
// Returns prefill logits [P, V] followed by decode rows 1.. (row 0 is the last prefill row).
inline std::vector<float> planned_run(const ModelWeights& w, const std::vector<int32_t>& prompt,
                                      const std::vector<int32_t>& fed, const ForwardOptions& opt,
                                      int64_t chunk, Policy policy = Policy::kPlanned,
                                      ReadKernel kernel = ReadKernel::kFused) {
  const int64_t V = w.config.vocab_size, P = static_cast<int64_t>(prompt.size());
  auto pf = PlannedForward::create(w, opt.act, chunk, policy, kernel);
  EXPECT_TRUE(pf.is_ok()) << pf.status().to_string();
  if (!pf.is_ok()) return {};
  TestSequence seq(w.config, opt.cache_dtype());
  SequenceState& state = seq.state;
  Arena arena;
  std::vector<float> out(static_cast<size_t>(P * V));
  for (int64_t t0 = 0; t0 < P; t0 += chunk) {
    const int64_t n = std::min(chunk, P - t0);
    Status st = (*pf)->run(state, opt, arena, prompt.data() + t0, n, true, out.data() + t0 * V);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  for (size_t j = 0; j + 1 < fed.size(); ++j) {
    std::vector<float> row(static_cast<size_t>(V));
    Status st = (*pf)->run(state, opt, arena, &fed[j], 1, false, row.data());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

}  // namespace attnres::testing
