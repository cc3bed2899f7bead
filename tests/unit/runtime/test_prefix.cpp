// The prefix store through the engine: a request whose prompt starts with an earlier one's
// restores the deepest snapshot and prefills only the rest. On random prompt pairs (identical,
// extended, diverging at a random position, multi-turn with the history edited), request B
// run after A with the store gives the same greedy tokens as B alone without it, logits bitwise
// equal to a model-level run of B split at the same positions, and within the chunked-prefill
// tolerance of B's unsplit run. A planted bug (the KDA state of the wrong position restored with
// a cache cut to the right one, what llama.cpp's partial reuse did to K3) must fail the check.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "runtime/session.h"  // argmax

#include "engine_util.h"

namespace attnres {
namespace {

using testing::golden_model;
using testing::Outcome;

constexpr int64_t kChunk = 8, kInterval = 16;

EngineOptions store_engine(bool store) {
  EngineOptions o;
  o.activation = ActivationType::kF32;
  o.prefill_chunk = kChunk;
  o.snapshot_interval = kInterval;
  o.page_tokens = 8;
  o.max_sequences = 4;
  o.prefix_cache_bytes = store ? int64_t{1} << 30 : 0;
  return o;
}

GenerationRequest greedy(std::vector<int32_t> prompt, int64_t n, bool snapshot_at_end = false) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_new_tokens = n;
  r.ignore_eos = true;
  r.keep_logits = true;
  r.snapshot_at_end = snapshot_at_end;
  return r;
}

// Where a request's sequence was cut: its prefill chunk ends and every fed generated token
// (the last one too when it was fed for snapshot_at_end).
std::set<int64_t> cuts_of(const GenerationRequest& r, const Outcome& o) {
  std::set<int64_t> c(o.prefill_marks.begin(), o.prefill_marks.end());
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  const int64_t g = static_cast<int64_t>(o.result.tokens.size());
  for (int64_t i = 1; i < g + (r.snapshot_at_end ? 1 : 0); ++i) c.insert(n + i);
  return c;
}

// What B observed: its tokens, the rows they were chosen from, and where its positions were
// cut (including the part restored from an earlier request's state).
struct Observed {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  std::set<int64_t> cuts;
  int64_t restored = 0;
};

// Every way B may differ from what it must be; empty when B is right.
std::vector<std::string> check(const ModelWeights& w, const GenerationRequest& b,
                               const Observed& seen, const Outcome& fresh) {
  std::vector<std::string> bad;
  if (seen.tokens != fresh.result.tokens) bad.push_back("greedy tokens differ from B alone");
  const int64_t n = static_cast<int64_t>(b.prompt.size());
  std::vector<int32_t> tokens = b.prompt;
  tokens.insert(tokens.end(), seen.tokens.begin(), seen.tokens.end() - 1);
  std::vector<int64_t> cuts(seen.cuts.begin(), seen.cuts.end());
  if (cuts.empty() || cuts.back() != static_cast<int64_t>(tokens.size()))
    cuts.push_back(static_cast<int64_t>(tokens.size()));
  std::vector<int64_t> rows;
  for (size_t j = 0; j < seen.tokens.size(); ++j) rows.push_back(n - 1 + static_cast<int64_t>(j));
  const std::vector<float> split =
      testing::replay(w, testing::forward_options(store_engine(false)), tokens, cuts, rows);
  if (split.size() != seen.logits.size() ||
      std::memcmp(split.data(), seen.logits.data(), split.size() * sizeof(float)) != 0)
    bad.push_back("logits differ from a fresh run split at the same positions");
  if (seen.logits.size() == fresh.result.token_logits.size()) {
    const float d = testing::max_abs_diff(seen.logits, fresh.result.token_logits);
    if (d > 2e-3f) bad.push_back("logits " + std::to_string(d) + " from B's unsplit run");
  }
  return bad;
}

// A, then B, in one engine with the store; B alone in one without.
struct PairRun {
  Outcome a, b, fresh;
};
PairRun run_pair(const char* set, const GenerationRequest& a, const GenerationRequest& b) {
  auto model = golden_model(set);
  auto e = Engine::create(model, store_engine(true));
  EXPECT_TRUE(e.is_ok());
  PairRun r;
  EXPECT_TRUE((*e)->submit(a, testing::record_into(r.a)).is_ok());
  EXPECT_TRUE((*e)->run().is_ok());
  EXPECT_TRUE((*e)->submit(b, testing::record_into(r.b)).is_ok());
  EXPECT_TRUE((*e)->run().is_ok());
  r.fresh = testing::run_requests(model, store_engine(false), {b})[0];
  return r;
}

Observed observed(const GenerationRequest& a, const PairRun& r) {
  Observed o;
  o.tokens = r.b.result.tokens;
  o.logits = r.b.result.token_logits;
  o.restored = r.b.result.cached_tokens;
  for (int64_t c : cuts_of(a, r.a))
    if (c <= o.restored) o.cuts.insert(c);
  if (o.restored > 0) o.cuts.insert(o.restored);
  GenerationRequest b;
  b.prompt.resize(static_cast<size_t>(r.b.result.prompt_tokens));
  const std::set<int64_t> own = cuts_of(b, r.b);
  o.cuts.insert(own.begin(), own.end());
  return o;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(rng() % vocab));
  return t;
}

TEST(PrefixStore, RandomPairsReuseExactly) {
  int restored_pairs = 0, whole_prompt_hits = 0;
  for (const char* set : {"tiny-a", "tiny-b"}) {
    const ModelWeights& w = golden_model(set)->weights();
    const int64_t V = w.config.vocab_size;
    std::mt19937 rng(set[5] == 'a' ? 5 : 6);
    for (int trial = 0; trial < 12; ++trial) {
      const int kind = trial % 4;  // identical, extended, diverging, multi-turn edited
      const std::vector<int32_t> pa = random_tokens(rng, 5 + rng() % 40, V);
      GenerationRequest a = greedy(pa, 1 + rng() % 5, kind == 3);
      std::vector<int32_t> pb = pa;
      if (kind == 1) {
        const auto more = random_tokens(rng, 1 + rng() % 20, V);
        pb.insert(pb.end(), more.begin(), more.end());
      } else if (kind == 2) {
        const size_t at = rng() % pa.size();
        pb.resize(at);
        const auto more = random_tokens(rng, 1 + rng() % 20, V);
        pb.insert(pb.end(), more.begin(), more.end());
      }
      PairRun r;
      if (kind == 3) {
        // Turn 2 after turn 1's reply, then a turn 2 whose reply part was edited.
        std::vector<int32_t> history = pa;
        {
          auto once = run_pair(set, a, a);  // only for A's own reply
          history.insert(history.end(), once.a.result.tokens.begin(), once.a.result.tokens.end());
        }
        const size_t keep = pa.size() + rng() % (history.size() - pa.size() + 1);
        pb.assign(history.begin(), history.begin() + static_cast<std::ptrdiff_t>(keep));
        const auto more = random_tokens(rng, 1 + rng() % 10, V);
        pb.insert(pb.end(), more.begin(), more.end());
      }
      const GenerationRequest b = greedy(pb, 1 + rng() % 5);
      r = run_pair(set, a, b);
      ASSERT_TRUE(r.a.finished && r.b.finished && r.fresh.finished);
      const Observed seen = observed(a, r);
      const std::vector<std::string> bad = check(w, b, seen, r.fresh);
      EXPECT_TRUE(bad.empty()) << set << " trial " << trial << " kind " << kind << ": "
                               << bad.front() << " (restored " << seen.restored << " of "
                               << pb.size() << ")";
      restored_pairs += seen.restored > 0 ? 1 : 0;
      whole_prompt_hits += seen.restored == static_cast<int64_t>(pb.size()) ? 1 : 0;
    }
  }
  EXPECT_GE(restored_pairs, 12);    // most pairs share a stored prefix
  EXPECT_GE(whole_prompt_hits, 4);  // identical prompts sample from the stored logits
}

// The planted bug: B's prefix restored with the KDA state one position too far (the state after
// p + 1 tokens, the latent cache cut to p), then B prefilled and decoded greedily from there,
// as an engine with that bug would. The same check must reject it.
Observed wrong_restore(const ModelWeights& w, const GenerationRequest& b, int64_t p, int64_t g) {
  const ForwardOptions opt = testing::forward_options(store_engine(false));
  const int64_t V = w.config.vocab_size, n = static_cast<int64_t>(b.prompt.size());
  auto pf = PlannedForward::create(w, opt.act, 1024);
  testing::TestSequence seq(w.config, opt.cache_dtype(), 8);
  Arena arena;
  std::vector<float> row(static_cast<size_t>(V));
  auto feed = [&](const int32_t* t, int64_t rows) {
    EXPECT_TRUE((*pf)->run(seq.state, opt, arena, t, rows, false, row.data()).is_ok());
  };
  Observed o;
  o.restored = p;
  for (int64_t c = 0; c <= p; c += kChunk) {  // the prefix p + 1, cut on the grid
    const int64_t end = std::min(c + kChunk, p + 1);
    feed(b.prompt.data() + c, end - c);
    if (end <= p) o.cuts.insert(end);
  }
  o.cuts.insert(p);
  seq.state.cache.truncate(p);
  seq.state.position = p;
  for (int64_t c = p; c < n; c = std::min(n, (c / kChunk + 1) * kChunk)) {
    const int64_t end = std::min(n, (c / kChunk + 1) * kChunk);
    feed(b.prompt.data() + c, end - c);
    o.cuts.insert(end);
  }
  for (int64_t j = 0; j < g; ++j) {
    o.logits.insert(o.logits.end(), row.begin(), row.end());
    o.tokens.push_back(argmax(row));
    if (j + 1 < g) {
      feed(&o.tokens.back(), 1);
      o.cuts.insert(n + j + 1);
    }
  }
  return o;
}

TEST(PrefixStore, RestoringTheStateOfTheWrongPositionIsCaught) {
  const ModelWeights& w = golden_model("tiny-b")->weights();
  std::mt19937 rng(9);
  int caught = 0;
  for (int trial = 0; trial < 4; ++trial) {
    std::vector<int32_t> prompt = random_tokens(rng, 20 + rng() % 20, w.config.vocab_size);
    const int64_t p = 10 + static_cast<int64_t>(rng() % 8);
    const GenerationRequest b = greedy(prompt, 4);
    const Outcome fresh =
        testing::run_requests(golden_model("tiny-b"), store_engine(false), {b})[0];
    const std::vector<std::string> bad = check(w, b, wrong_restore(w, b, p, 4), fresh);
    caught += bad.empty() ? 0 : 1;
    EXPECT_FALSE(bad.empty()) << "trial " << trial << ": the wrong restore went unnoticed";
  }
  EXPECT_EQ(caught, 4);
}

// The store's counters make reuse visible, and its bytes stay within the limit (LRU eviction).
TEST(PrefixStore, CountersAndEviction) {
  auto model = golden_model("tiny-a");
  EngineOptions o = store_engine(true);
  o.prefix_cache_bytes = 6 * kda_state_bytes(model->weights().config);  // a few snapshots
  auto e = Engine::create(model, o);
  ASSERT_TRUE(e.is_ok());
  std::mt19937 rng(3);
  std::vector<int32_t> shared = random_tokens(rng, 20, model->info().vocab_size);
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p = shared;
    const auto tail = random_tokens(rng, 3, model->info().vocab_size);
    p.insert(p.end(), tail.begin(), tail.end());
    ASSERT_TRUE((*e)->submit(greedy(p, 2), {}).is_ok());
    ASSERT_TRUE((*e)->run().is_ok());
    EXPECT_LE((*e)->stats().prefix_bytes, o.prefix_cache_bytes);
  }
  const EngineStats& s = (*e)->stats();
  EXPECT_EQ(s.prefix_lookups, 6);
  EXPECT_EQ(s.prefix_hits, 5);  // every later request restores the interval snapshot at 16
  EXPECT_EQ(s.prefix_tokens_restored, 5 * kInterval);
  EXPECT_GE(s.prefix_tokens_matched, 5 * 20);
  EXPECT_EQ(s.prefix_tokens_recomputed, 6 * 23 - 5 * kInterval);
  EXPECT_GT(s.prefix_entries, 0);
}

}  // namespace
}  // namespace attnres
