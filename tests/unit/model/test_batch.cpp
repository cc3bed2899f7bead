// Batch invariance of the production forward step (model/batch.h, PlannedForward over
// segments): a sequence's logits are bitwise the same whether its segments run alone or share
// steps with other sequences' prefill chunks and decode tokens, in any row position, at 1 and 2
// threads, in f32 and bf16, with bf16, f32 and fp8 latent caches. Compared with memcmp.
#include <gtest/gtest.h>
#include "util/parallel.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "golden_util.h"

namespace attnres {
namespace {

using testing::golden;

// One sequence's work: its tokens fed in segments (prefill chunks then single decode tokens),
// and the logits of the last row of every segment.
struct Work {
  std::vector<int32_t> tokens;
  std::vector<int64_t> cuts;  // segment ends, increasing, last == tokens.size()
};

Work make_work(std::mt19937& rng, int64_t vocab, int64_t chunk) {
  Work w;
  const int64_t prompt = 1 + static_cast<int64_t>(rng() % 24), decode = 1 + rng() % 4;
  for (int64_t i = 0; i < prompt + decode; ++i)
    w.tokens.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
  for (int64_t p = chunk; p < prompt; p += chunk) w.cuts.push_back(p);
  for (int64_t p = prompt; p <= prompt + decode; ++p) w.cuts.push_back(p);
  return w;
}

// Logits rows [segments, V] of every sequence, run with `mix`: each step takes a random subset
// (in random row order) of the sequences that have segments left; with mix == false every
// sequence runs alone, one segment per step.
std::vector<std::vector<float>> run_all(const ModelWeights& w, const ForwardOptions& opt,
                                        const std::vector<Work>& works, bool mix, uint32_t seed) {
  const int64_t V = w.config.vocab_size;
  auto pf = PlannedForward::create(w, opt.act, /*max_tokens=*/256);
  EXPECT_TRUE(pf.is_ok()) << pf.status().to_string();
  KvPool pool(w.config, opt.cache_dtype(), /*page_tokens=*/8);
  std::vector<SequenceState> states;
  for (size_t i = 0; i < works.size(); ++i)
    states.push_back(SequenceState::create(w.config, pool).value());
  std::vector<size_t> next(works.size(), 0);  // next segment of each sequence
  std::vector<std::vector<float>> out(works.size());
  std::mt19937 rng(seed);
  Arena arena;
  auto pending = [&] {
    std::vector<size_t> p;
    for (size_t i = 0; i < works.size(); ++i)
      if (next[i] < works[i].cuts.size()) p.push_back(i);
    return p;
  };
  for (std::vector<size_t> todo = pending(); !todo.empty(); todo = pending()) {
    std::shuffle(todo.begin(), todo.end(), rng);
    const size_t take = mix ? 1 + rng() % todo.size() : 1;
    std::vector<Segment> segs;
    std::vector<int32_t> tokens;
    std::vector<int64_t> rows;
    for (size_t k = 0; k < take; ++k) {
      const size_t i = todo[k];
      const int64_t begin = next[i] == 0 ? 0 : works[i].cuts[next[i] - 1];
      const int64_t end = works[i].cuts[next[i]];
      segs.push_back(Segment{&states[i], static_cast<int64_t>(tokens.size()), end - begin});
      tokens.insert(tokens.end(), works[i].tokens.begin() + begin, works[i].tokens.begin() + end);
      rows.push_back(static_cast<int64_t>(tokens.size()) - 1);
    }
    EXPECT_TRUE(reserve_segments(segs).is_ok());
    std::vector<float> logits(rows.size() * static_cast<size_t>(V));
    Status st = (*pf)->run(segs, opt, arena, tokens.data(), rows, logits.data());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) return out;
    for (size_t k = 0; k < take; ++k) {
      const size_t i = todo[k];
      out[i].insert(out[i].end(), logits.begin() + static_cast<std::ptrdiff_t>(k * V),
                    logits.begin() + static_cast<std::ptrdiff_t>((k + 1) * V));
      ++next[i];
    }
  }
  return out;
}

// 1..16 sequences: alone on one thread, then mixed on 1 and on 2 threads.
void expect_invariant(const char* set, const ForwardOptions& opt, uint32_t seed) {
  const testing::GoldenSet& g = golden(set);
  std::mt19937 rng(seed);
  std::vector<Work> works;
  const int n = 1 + static_cast<int>(rng() % 16);
  for (int i = 0; i < n; ++i) works.push_back(make_work(rng, g.weights.config.vocab_size, 7));
  const int saved = parallel_threads();
  set_parallel_threads(1);
  const auto alone = run_all(g.weights, opt, works, false, seed);
  for (int threads : {1, 2}) {
    set_parallel_threads(threads);
    const auto mixed = run_all(g.weights, opt, works, true, seed + static_cast<uint32_t>(threads));
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(alone[i].size(), mixed[i].size());
      EXPECT_EQ(std::memcmp(alone[i].data(), mixed[i].data(), alone[i].size() * sizeof(float)), 0)
          << set << " " << act_dtype_name(opt.act) << " cache "
          << kv_cache_dtype_name(opt.cache_dtype()) << " threads " << threads << " seed " << seed
          << ": sequence " << i << " of " << n << " differs";
    }
  }
  set_parallel_threads(saved);
}

TEST(BatchInvariance, LogitsDoNotDependOnWhatSharesTheStep) {
  uint32_t seed = 1;
  for (const char* set : {"tiny-a", "tiny-b"}) {
    for (ActDType act : {ActDType::kF32, ActDType::kBF16}) {
      for (KvCacheDtype kv : {KvCacheDtype::kAuto, KvCacheDtype::kFP8}) {
        ForwardOptions opt;
        opt.act = act;
        opt.kv = kv;
        expect_invariant(set, opt, seed);
        seed += 3;
      }
    }
  }
}

// A sequence run alone through the batched step equals the single-sequence path bitwise.
TEST(BatchInvariance, SingleSequenceStepEqualsPlannedRun) {
  const testing::GoldenSet& g = golden("tiny-b");
  const std::vector<int32_t> prompt = g.ids("case1.prompt_ids");
  const std::vector<int32_t> fed = g.ids("case1.greedy_ids");
  for (ActDType act : {ActDType::kF32, ActDType::kBF16}) {
    ForwardOptions opt;
    opt.act = act;
    const std::vector<float> planned = testing::planned_run(g.weights, prompt, fed, opt, 16);
    Work w;
    w.tokens = prompt;
    w.tokens.insert(w.tokens.end(), fed.begin(), fed.end() - 1);
    for (int64_t p = 16; p < static_cast<int64_t>(prompt.size()); p += 16) w.cuts.push_back(p);
    for (size_t p = prompt.size(); p <= w.tokens.size(); ++p)
      w.cuts.push_back(static_cast<int64_t>(p));
    const auto got = run_all(g.weights, opt, {w}, false, 3);
    // planned_run's row p holds the logits after position p: compare the last row of each
    // segment.
    const int64_t V = g.weights.config.vocab_size;
    for (size_t k = 0; k < w.cuts.size(); ++k) {
      const int64_t row = w.cuts[k] - 1;
      ASSERT_EQ(std::memcmp(got[0].data() + k * V, planned.data() + row * V, V * sizeof(float)), 0)
          << act_dtype_name(act) << " segment " << k;
    }
  }
}

}  // namespace
}  // namespace attnres
