// Tensor parallelism (docs/parallel.md) with P ranks as threads (thread_group.h): balanced
// partitions, fused gathers, per-rank weight shares, and the central property: the forward
// step's logits, and the engine's results over several concurrent sequences driven through the
// leader/follower protocol, are bitwise those of one process at P = 2, 3 and 4, on both golden
// models and the tp-odd preset (no split dimension divisible by 3), in f32 and bf16, for
// one-shot and chunked prefill and decode. Compared with memcmp. The same property across real
// processes (mpirun, `run --dump-logits` and cmp) is tests/mpi/.
#include <gtest/gtest.h>

#include <bit>

#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "../model/golden_util.h"
#include "attnres/engine.h"
#include "attnres/parallel.h"
#include "io/weights.h"
#include "model/planned.h"
#include "model/tp_plan.h"
#include "parallel/gather.h"
#include "runtime/follower.h"
#include "synth/synth.h"
#include "thread_group.h"
#include "util/lanes.h"
#include "util/mxfp4_lanes.h"

namespace attnres {
namespace {

// Bitwise equality of two logit vectors (memcmp; empty vectors have no data pointer).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

using test::ThreadGroup;

// The models of the invariance tests: both golden fixtures and a tp-odd checkpoint written once.
std::string model_dir(const std::string& name) {
  if (name != "tp-odd") return testing::golden_dir(name);
  static const std::string dir = [] {
    const std::string d =
        (std::filesystem::temp_directory_path() / ("attnres-tp-odd-" + std::to_string(getpid())))
            .string();
    auto preset = synth_preset("tp-odd");
    EXPECT_TRUE(preset.is_ok());
    auto r = write_synthetic_model(*preset, d, /*seed=*/7, /*overwrite=*/true);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return d;
  }();
  return dir;
}

struct RemoveTpOdd : ::testing::Environment {
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(
        std::filesystem::temp_directory_path() / ("attnres-tp-odd-" + std::to_string(getpid())),
        ec);
  }
};
const auto* const kRemove = ::testing::AddGlobalTestEnvironment(new RemoveTpOdd);

TEST(Partition, BalancedContiguousCoverForAnyRankCount) {
  for (int64_t n : {1, 2, 3, 5, 7, 11, 96, 176, 1000, 163840}) {
    for (int P = 1; P <= 33; ++P) {
      Shard s{0, P};
      int64_t next = 0, lo = n, hi = 0;
      for (int r = 0; r < P; ++r) {
        const Range g = s.range_of(n, r);
        EXPECT_EQ(g.begin, next) << "n " << n << " P " << P << " r " << r;
        next = g.end;
        lo = std::min(lo, g.size());
        hi = std::max(hi, g.size());
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(hi - lo, 1) << "n " << n << " P " << P;
      EXPECT_EQ(hi, s.max_units(n)) << "n " << n << " P " << P;
    }
  }
}

// Random parts (f32 and bf16, in place and from a local buffer, several per collective) are
// assembled bitwise on every rank.
TEST(Gather, FusedPartsAssembleEveryRanksColumns) {
  for (int P : {1, 2, 3, 4, 5}) {
    ThreadGroup g(P);
    std::mt19937 seed_rng(static_cast<uint32_t>(P));
    const int64_t rows = 3, units_a = 7, unit_a = 5, units_b = 13, ld_b = 20;
    std::vector<float> want_a(rows * units_a * unit_a), want_b(rows * ld_b, 0.0f);
    for (float& v : want_a) v = static_cast<float>(seed_rng() % 1000) * 0.37f;
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t i = 0; i < units_b; ++i)  // bf16 values: low 16 bits zero
        want_b[t * ld_b + i] = static_cast<float>(static_cast<int>(seed_rng() % 256) - 128);
    std::vector<int> ok(static_cast<size_t>(P), 0);
    g.run([&](int r) {
      TensorParallel tp(g.comm(r));
      const Range ca = Shard::range_of(units_a, r, P), cb = Shard::range_of(units_b, r, P);
      std::vector<float> a(want_a.size(), -1.0f), b(want_b.size(), 0.0f);
      std::vector<float> local_a(rows * ca.size() * unit_a);
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t i = 0; i < ca.size() * unit_a; ++i)
          local_a[t * ca.size() * unit_a + i] =
              want_a[t * units_a * unit_a + ca.begin * unit_a + i];
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t i = cb.begin; i < cb.end; ++i) b[t * ld_b + i] = want_b[t * ld_b + i];
      GatherPart pa;
      pa.full = a.data();
      pa.rows = rows;
      pa.units = units_a;
      pa.unit = unit_a;
      pa.local = local_a.data();
      GatherPart pb;
      pb.full = b.data();
      pb.rows = rows;
      pb.units = units_b;
      pb.ld = ld_b;
      pb.bf16 = true;
      const GatherPart parts[2] = {pa, pb};
      tp.gather(parts);
      ok[static_cast<size_t>(r)] = std::memcmp(a.data(), want_a.data(), 4 * a.size()) == 0 &&
                                   std::memcmp(b.data(), want_b.data(), 4 * b.size()) == 0;
      if (P > 1) {
        EXPECT_EQ(tp.stats().gathers, 1);
        EXPECT_EQ(tp.stats().gather_bytes, rows * (units_a * unit_a * 4 + units_b * 2));
      }
    });
    for (int r = 0; r < P; ++r) EXPECT_TRUE(ok[static_cast<size_t>(r)]) << "P " << P << " r " << r;
  }
}

// Bytes of the absorbed copies a load made (MLA's w_uk_t and w_uv), from the views themselves.
int64_t absorbed_copy_bytes(const ModelWeights& w) {
  int64_t bytes = 0;
  for (const LayerWeights& l : w.layers) {
    if (!l.mla) continue;
    for (const auto* copies : {&l.mla->w_uk_t, &l.mla->w_uv})
      for (const Matrix& m : *copies)
        bytes += m.layout == Layout::kBf16Lanes ? lanes_size(m.shape[0], m.shape[1]) * 2
                                                : static_cast<int64_t>(m.nbytes);
  }
  return bytes;
}

// Each rank binds only its rows: the shares of the sharded tensors add up to the whole, the
// replicated part is the same on every rank, shard_tensor_bytes() predicts every rank's bytes,
// and at P = 4 each rank is within 10% of a quarter of the sharded bytes plus the replicated.
// The copies a rank makes at load are counted (rank_copy_bytes), and `plan --ranks`
// (tp_rank_plans) predicts them and the bound bytes where the checkpoint has the release dtypes.
TEST(WeightShards, EveryRankBindsItsRowsOnly) {
  for (const std::string name : {"tiny-a", "tiny-b", "tp-odd"}) {
    auto whole = load_model(model_dir(name));
    ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
    const int64_t total = whole->report.rank_bytes, repl = whole->report.rank_replicated_bytes;
    const std::vector<TensorSpec> specs = model_tensor_specs(whole->config);
    for (int P : {2, 3, 4}) {
      int64_t sharded_sum = 0;
      for (int r = 0; r < P; ++r) {
        auto w = load_model(model_dir(name), Shard{r, P});
        ASSERT_TRUE(w.is_ok()) << w.status().to_string();
        EXPECT_EQ(w->report.rank_replicated_bytes, repl) << name;
        sharded_sum += w->report.rank_bytes - w->report.rank_replicated_bytes;
        int64_t predicted = 0;
        for (const TensorSpec& s : specs) {
          const DType dt = s.u8 ? DType::kU8 : release_dtype(s.name);
          predicted += shard_tensor_bytes(s, dt, Shard{r, P});
        }
        EXPECT_GT(w->report.rank_copy_bytes, 0) << name;
        EXPECT_EQ(w->report.rank_copy_bytes, absorbed_copy_bytes(*w)) << name << " P " << P;
        if (name == "tp-odd") {
          // The synthetic checkpoint stores A_log zero-padded to head_dim (as the release
          // does); the specs have its canonical [H].
          const ModelConfig& c = w->config;
          const int64_t padding = c.schedule.num_kda * (c.linear.head_dim - c.linear.num_heads) * 4;
          EXPECT_EQ(predicted + padding, w->report.rank_bytes) << "P " << P;
          const TpRankPlan plan = tp_rank_plans(c, P)[static_cast<size_t>(r)];
          EXPECT_EQ(plan.weight_bytes + padding, w->report.rank_bytes) << "P " << P;
          EXPECT_EQ(plan.copy_bytes, w->report.rank_copy_bytes) << "P " << P;
        }
        if (P == 4) {
          const double ideal = static_cast<double>(total - repl) / 4 + static_cast<double>(repl);
          EXPECT_NEAR(static_cast<double>(w->report.rank_bytes), ideal, 0.10 * ideal) << name;
        }
      }
      EXPECT_EQ(sharded_sum, total - repl) << name << " P " << P;
    }
  }
}

// With P > 1 a rank's rows of every sharded tensor live in private memory read from the file,
// never in the shared mapping (whose fault-around would make other ranks' rows resident too):
// each sharded view lies in ModelWeights::private_memory and holds exactly the bytes of its rows
// in the whole tensor. The replicated views are read into private memory too by default
// (WeightResidence::kPrivate) and stay in the mapping with kMapped; an untied embedding, whose
// rows are only looked up, stays in the mapping either way. The BF16 projections are lane-packed
// (io/weights.h) into private memory always; at P = 1 kMapped copies nothing else. MXFP4 codes
// read into private memory are stored in row quads where a rank's rows fit them.
TEST(WeightShards, ShardedRowsAreReadIntoPrivateMemory) {
  for (const std::string name : {"tiny-a", "tp-odd"}) {
    auto whole = load_model(model_dir(name), {}, WeightResidence::kMapped);
    ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
    int64_t packed_bytes = 0;
    for (const LayerWeights& l : whole->layers) {
      const TensorView& o = l.kda ? l.kda->o_proj : l.mla->o_proj;
      EXPECT_EQ(o.layout, Layout::kBf16Lanes) << o.name;
      EXPECT_TRUE(whole->private_memory->contains(o.data, o.nbytes)) << o.name;
      EXPECT_FALSE(whole->private_memory->contains(l.input_norm.data, l.input_norm.nbytes));
      if (l.mla) {  // read by the attention kernels as well: stays row-major in the mapping
        EXPECT_EQ(l.mla->kv_b_proj.layout, Layout::kRowMajor);
        EXPECT_FALSE(
            whole->private_memory->contains(l.mla->kv_b_proj.data, l.mla->kv_b_proj.nbytes));
      }
      packed_bytes += lanes_size(o.shape[0], o.shape[1]) * 2;
    }
    EXPECT_GE(whole->report.bytes_private, packed_bytes);
    for (const WeightResidence residence : {WeightResidence::kPrivate, WeightResidence::kMapped}) {
      const bool copies = residence == WeightResidence::kPrivate;
      for (int P : {1, 2, 3}) {
        if (P == 1 && !copies) continue;  // checked above
        for (int r = 0; r < P; ++r) {
          auto w = load_model(model_dir(name), Shard{r, P}, residence);
          ASSERT_TRUE(w.is_ok()) << w.status().to_string();
          const WeightMemory& owned = *w->private_memory;
          int checked = 0;
          // `part` is this rank's rows of `full` (split in `units` units of the first dimension).
          auto expect_private = [&](const TensorView& part, const TensorView& full, int64_t units) {
            SCOPED_TRACE(name + " P " + std::to_string(P) + " rank " + std::to_string(r) + " " +
                         full.name);
            const Range u = Shard{r, P}.range(units);
            const int64_t unit_rows = full.shape[0] / units, row0 = u.begin * unit_rows;
            const int64_t n_rows = u.size() * unit_rows, K = full.numel() / full.shape[0];
            ASSERT_EQ(part.nbytes, full.nbytes / static_cast<size_t>(units) * u.size());
            if (part.layout == Layout::kMxfp4Lanes) {  // MXFP4 codes or scales in whole groups
              ASSERT_EQ(full.layout, Layout::kRowMajor);
              ASSERT_EQ(n_rows % kMxfp4LaneRows, 0);
            } else {
              ASSERT_EQ(part.layout, full.layout);
            }
            if (part.nbytes == 0) return;
            EXPECT_TRUE(owned.contains(part.data, part.nbytes));
            EXPECT_EQ(reinterpret_cast<uintptr_t>(part.data) % 64, 0u);
            if (part.layout == Layout::kMxfp4Lanes) {            // each rank packs its own rows
              const auto* rows = full.as<uint8_t>() + row0 * K;  // K bytes a row
              const bool codes = full.name.ends_with("weight_packed");  // else the scales
              for (int64_t n = 0; n < n_rows; ++n)
                for (int64_t c = 0; c < K; ++c) {
                  if (codes) {  // two elements a byte, each code where the layout puts it
                    for (int64_t e = 0; e < 2; ++e)
                      ASSERT_EQ(mxfp4_lanes_code(part.as<uint8_t>(), n, 2 * c + e, 2 * K),
                                (rows[n * K + c] >> (4 * e)) & 0x0f)
                          << "row " << n << " element " << 2 * c + e;
                  } else {
                    ASSERT_EQ(part.as<uint8_t>()[mxfp4_lanes_scale(n, c, kMxfp4BlockSize * K)],
                              rows[n * K + c])
                        << "row " << n << " block " << c;
                  }
                }
            } else if (full.layout == Layout::kRowMajor) {
              const TensorView rows = slice_rows(full, row0, n_rows);
              EXPECT_EQ(std::memcmp(part.data, rows.data, rows.nbytes), 0);
            } else {  // each rank packs its own rows
              for (int64_t i = 0; i < n_rows * K; ++i)
                ASSERT_EQ(std::bit_cast<uint32_t>(part.get_f32(i)),
                          std::bit_cast<uint32_t>(full.get_f32(row0 * K + i)))
                    << "element " << i;
            }
            ++checked;
          };
          const ModelConfig& c = w->config;
          for (size_t l = 0; l < w->layers.size(); ++l) {
            const LayerWeights& a = w->layers[l];
            const LayerWeights& b = whole->layers[l];
            if (a.kda) {
              expect_private(a.kda->q_proj, b.kda->q_proj, c.linear.num_heads);
              expect_private(a.kda->o_proj, b.kda->o_proj, c.hidden_size);
            } else {
              expect_private(a.mla->o_proj, b.mla->o_proj, c.hidden_size);
            }
            if (a.moe) {
              const ExpertMatrix& x = a.moe->experts[0].w1;
              const ExpertMatrix& y = b.moe->experts[0].w1;
              if (x.mxfp4) {
                expect_private(x.packed, y.packed, y.rows);
                expect_private(x.scale, y.scale, y.rows);
              } else {
                expect_private(x.dense, y.dense, y.rows);
              }
            }
            // Replicated: the same bytes, read into private memory or viewed in the mapping.
            EXPECT_EQ(owned.contains(a.input_norm.data, a.input_norm.nbytes), copies);
            EXPECT_EQ(std::memcmp(a.input_norm.data, b.input_norm.data, b.input_norm.nbytes), 0);
          }
          EXPECT_GT(checked, 0);
          EXPECT_EQ(owned.contains(w->embed.data, w->embed.nbytes),
                    copies && c.tie_word_embeddings);
          EXPECT_EQ(static_cast<size_t>(w->report.bytes_private) <= owned.bytes_used(), true);
        }
      }
    }
  }
}

// A fixed schedule of batched steps over three sequences: two prefills sharing a step (one of
// them chunked), a chunk next to a new prefill, then greedy decode of all three together.
// Returns every logits row the steps produced, in order.
std::vector<float> run_schedule(const ModelWeights& w, ActDType act, TensorParallel* tp) {
  ForwardOptions opt;
  opt.act = act;
  opt.tp = tp;
  const int64_t V = w.config.vocab_size;
  auto pf = PlannedForward::create(w, act, /*max_tokens=*/64);
  EXPECT_TRUE(pf.is_ok()) << pf.status().to_string();
  if (!pf.is_ok()) return {};
  KvPool pool(w.config, opt.cache_dtype(), /*page_tokens=*/4);
  std::vector<SequenceState> st;
  for (int i = 0; i < 3; ++i)
    st.push_back(SequenceState::create(w.config, pool, nullptr, w.shard).value());
  std::mt19937 rng(11);
  auto prompt = [&](int n) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(rng() % (V - 8)));
    return p;
  };
  const std::vector<int32_t> p0 = prompt(9), p1 = prompt(9), p2 = prompt(3);
  std::vector<float> all;
  Arena arena;
  std::vector<int32_t> last(3, 0);
  struct Piece {
    int seq;
    std::vector<int32_t> tokens;
    bool all_rows;
  };
  auto step = [&](const std::vector<Piece>& pieces) {
    std::vector<Segment> segs;
    std::vector<int32_t> tokens;
    std::vector<int64_t> rows;
    std::vector<int> last_row_of;
    for (const Piece& p : pieces) {
      const int64_t row0 = static_cast<int64_t>(tokens.size()), n = std::ssize(p.tokens);
      segs.push_back(Segment{&st[static_cast<size_t>(p.seq)], row0, n});
      tokens.insert(tokens.end(), p.tokens.begin(), p.tokens.end());
      for (int64_t i = p.all_rows ? 0 : n - 1; i < n; ++i) rows.push_back(row0 + i);
      last_row_of.push_back(static_cast<int>(rows.size()) - 1);
    }
    EXPECT_TRUE(reserve_segments(segs).is_ok());
    std::vector<float> logits(rows.size() * static_cast<size_t>(V));
    Status s = (*pf)->run(segs, opt, arena, tokens.data(), rows, logits.data());
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    all.insert(all.end(), logits.begin(), logits.end());
    for (size_t k = 0; k < pieces.size(); ++k) {  // greedy: the next decode token
      const float* row = logits.data() + static_cast<size_t>(last_row_of[k]) * V;
      last[static_cast<size_t>(pieces[k].seq)] =
          static_cast<int32_t>(std::max_element(row, row + V) - row);
    }
  };
  step({{0, p0, true}, {1, {p1.begin(), p1.begin() + 5}, true}});
  step({{1, {p1.begin() + 5, p1.end()}, true}, {2, p2, false}});
  for (int d = 0; d < 4; ++d)
    step({{2, {last[2]}, true}, {0, {last[0]}, true}, {1, {last[1]}, true}});
  return all;
}

// Where the weights live changes no bit of the output: the schedule's logits from weights read
// into private memory equal those from views of the file mapping, in both activation dtypes.
TEST(WeightShards, ResidenceChangesNoLogit) {
  for (const std::string name : {"tiny-a", "tp-odd"}) {
    auto copied = load_model(model_dir(name), {}, WeightResidence::kPrivate);
    auto mapped = load_model(model_dir(name), {}, WeightResidence::kMapped);
    ASSERT_TRUE(copied.is_ok() && mapped.is_ok());
    ASSERT_GT(copied->report.bytes_private, 0);
    for (const ActDType act : {ActDType::kF32, ActDType::kBF16}) {
      const std::vector<float> a = run_schedule(*copied, act, nullptr);
      const std::vector<float> b = run_schedule(*mapped, act, nullptr);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << name << " " << act_dtype_name(act);
    }
  }
}

class TpForward : public ::testing::TestWithParam<std::tuple<std::string, ActDType>> {};

TEST_P(TpForward, LogitsBitwiseEqualAtTwoThreeAndFourRanks) {
  const auto& [name, act] = GetParam();
  set_thread_count(1);
  auto whole = load_model(model_dir(name));
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  const std::vector<float> want = run_schedule(*whole, act, nullptr);
  ASSERT_FALSE(want.empty());
  for (int P : {2, 3, 4}) {
    ThreadGroup g(P);
    std::vector<std::vector<float>> got(static_cast<size_t>(P));
    g.run([&](int r) {
      auto w = load_model(model_dir(name), Shard{r, P});
      ASSERT_TRUE(w.is_ok()) << w.status().to_string();
      TensorParallel tp(g.comm(r));
      got[static_cast<size_t>(r)] = run_schedule(*w, act, &tp);
    });
    for (int r = 0; r < P; ++r) {
      const auto& v = got[static_cast<size_t>(r)];
      ASSERT_EQ(v.size(), want.size()) << "P " << P << " rank " << r;
      EXPECT_EQ(std::memcmp(v.data(), want.data(), 4 * want.size()), 0)
          << name << " P " << P << " rank " << r;
    }
  }
  set_thread_count(default_thread_count());
}

INSTANTIATE_TEST_SUITE_P(Models, TpForward,
                         ::testing::Combine(::testing::Values("tiny-a", "tiny-b", "tp-odd"),
                                            ::testing::Values(ActDType::kF32, ActDType::kBF16)),
                         [](const auto& param_info) {
                           std::string n = std::get<0>(param_info.param);
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n + (std::get<1>(param_info.param) == ActDType::kF32 ? "_f32"
                                                                                       : "_bf16");
                         });

// `attnres plan --ranks` counts the gathers and gathered bytes of a decoded token as the blocks
// make them: compared with the communicator's counters over one decode step.
TEST(TpTraffic, PlanCountsWhatADecodeStepGathers) {
  set_thread_count(1);
  for (const std::string name : {"tiny-a", "tiny-b", "tp-odd"}) {
    for (ActDType act : {ActDType::kF32, ActDType::kBF16}) {
      const int P = 3;
      ThreadGroup g(P);
      std::vector<CommStats> delta(P);
      g.run([&](int r) {
        auto w = load_model(model_dir(name), Shard{r, P});
        ASSERT_TRUE(w.is_ok()) << w.status().to_string();
        TensorParallel tp(g.comm(r));
        ForwardOptions opt;
        opt.act = act;
        opt.tp = &tp;
        auto pf = PlannedForward::create(*w, act, 8);
        ASSERT_TRUE(pf.is_ok());
        KvPool pool(w->config, opt.cache_dtype(), 4);
        SequenceState st = SequenceState::create(w->config, pool, nullptr, w->shard).value();
        Arena arena;
        std::vector<float> logits(static_cast<size_t>(w->config.vocab_size));
        const int32_t prompt[3] = {5, 6, 7}, next = 8;
        ASSERT_TRUE((*pf)->run(st, opt, arena, prompt, 3, false, logits.data()).is_ok());
        const CommStats before = tp.stats();
        ASSERT_TRUE((*pf)->run(st, opt, arena, &next, 1, false, logits.data()).is_ok());
        delta[static_cast<size_t>(r)].gathers = tp.stats().gathers - before.gathers;
        delta[static_cast<size_t>(r)].gather_bytes = tp.stats().gather_bytes - before.gather_bytes;
      });
      auto whole = load_model(model_dir(name));
      ASSERT_TRUE(whole.is_ok());
      const TpTraffic t = tp_decode_traffic(whole->config, P, act == ActDType::kBF16);
      for (int r = 0; r < P; ++r) {
        EXPECT_EQ(delta[static_cast<size_t>(r)].gathers, t.gathers) << name << " rank " << r;
        EXPECT_EQ(delta[static_cast<size_t>(r)].gather_bytes, t.gather_bytes) << name;
      }
    }
  }
  set_thread_count(default_thread_count());
}

// Requests of the engine test: greedy and seeded sampling, with logits kept.
std::vector<GenerationRequest> engine_requests(int64_t V) {
  std::vector<GenerationRequest> reqs;
  std::mt19937 rng(5);
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    for (int k = 0; k < 3 + 4 * i; ++k) r.prompt.push_back(static_cast<int32_t>(rng() % (V - 8)));
    r.max_new_tokens = 5 + i;
    r.ignore_eos = true;
    r.keep_logits = true;
    r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.8f;
    r.sampling.top_k = i % 2 == 0 ? 0 : 20;
    r.sampling.seed = 100 + static_cast<uint64_t>(i);
    reqs.push_back(r);
  }
  return reqs;
}

// The leader's loop: two requests, a step, two more (one cancelled after two steps), to the end.
std::vector<GenerationResult> drive(Engine& e, const std::vector<GenerationRequest>& reqs) {
  std::vector<GenerationResult> out(reqs.size());
  auto submit = [&](size_t i) {
    GenerationCallbacks cb;
    cb.on_finish = [&out, i](GenerationResult&& r) { out[i] = std::move(r); };
    auto id = e.submit(reqs[i], std::move(cb));
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    return id.is_ok() ? *id : RequestId{0};
  };
  submit(0);
  submit(1);
  EXPECT_TRUE(e.step().is_ok());
  submit(2);
  const RequestId third = submit(3);
  EXPECT_TRUE(e.step().is_ok());
  EXPECT_TRUE(e.step().is_ok());
  e.cancel(third);
  EXPECT_TRUE(e.run().is_ok());
  return out;
}

EngineOptions engine_options(ActivationType act) {
  EngineOptions o;
  o.activation = act;
  o.max_sequences = 3;
  o.prefill_chunk = 4;
  o.page_tokens = 4;
  o.context_length = 64;
  return o;
}

class TpEngine : public ::testing::TestWithParam<std::tuple<std::string, ActivationType>> {};

// The engine on P ranks (leader + followers through the protocol) gives the leader bitwise the
// results of one process: tokens, prompt and token logits, finish reasons.
TEST_P(TpEngine, ConcurrentSequencesBitwiseEqualAcrossRankCounts) {
  const auto& [name, act] = GetParam();
  set_thread_count(1);
  ModelLoadOptions lo;
  lo.dir = model_dir(name);
  lo.require_tokenizer = false;
  lo.group = std::make_shared<SingleProcess>();
  auto single = Model::load(lo);
  ASSERT_TRUE(single.is_ok()) << single.status().to_string();
  const auto reqs = engine_requests((*single)->info().vocab_size);
  std::vector<GenerationResult> want;
  {
    auto e = Engine::create(*single, engine_options(act));
    ASSERT_TRUE(e.is_ok()) << e.status().to_string();
    want = drive(**e, reqs);
  }
  for (int P : {2, 3}) {
    ThreadGroup g(P);
    std::vector<GenerationResult> got;
    int64_t collectives = 0;
    g.run([&](int r) {
      ModelLoadOptions o = lo;
      o.group = g.comm(r);
      if (r != 0) {
        FollowerOptions fo;
        fo.load = o;
        fo.threads = 1;
        EXPECT_EQ(follow_leader(fo), 0);
        return;
      }
      {
        auto m = Model::load(o);
        ASSERT_TRUE(m.is_ok()) << m.status().to_string();
        EXPECT_EQ((*m)->info().ranks, P);
        auto e = Engine::create(*m, engine_options(act));
        ASSERT_TRUE(e.is_ok()) << e.status().to_string();
        got = drive(**e, reqs);
        collectives = (*e)->stats().collectives;
      }
      send_to_followers(*g.comm(0), LeaderOp::kExit, 0, "");
    });
    ASSERT_EQ(got.size(), want.size());
    EXPECT_GT(collectives, 0);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << name << " P " << P << " request " << i;
      EXPECT_EQ(got[i].reason, want[i].reason) << "request " << i;
      ASSERT_EQ(got[i].prompt_logits.size(), want[i].prompt_logits.size());
      ASSERT_EQ(got[i].token_logits.size(), want[i].token_logits.size());
      EXPECT_TRUE(same_bits(got[i].prompt_logits, want[i].prompt_logits)) << "request " << i;
      EXPECT_TRUE(same_bits(got[i].token_logits, want[i].token_logits)) << "request " << i;
    }
    EXPECT_EQ(want[3].reason, FinishReason::kCancelled);
  }
  set_thread_count(default_thread_count());
}

INSTANTIATE_TEST_SUITE_P(
    Models, TpEngine,
    ::testing::Combine(::testing::Values("tiny-a", "tp-odd"),
                       ::testing::Values(ActivationType::kF32, ActivationType::kBF16)),
    [](const auto& param_info) {
      std::string n = std::get<0>(param_info.param);
      for (char& c : n)
        if (c == '-') c = '_';
      return n + (std::get<1>(param_info.param) == ActivationType::kF32 ? "_f32" : "_bf16");
    });

// A rank that cannot load its share fails the load on every rank, and the leader's error names
// that rank and the reason; the group then ends cleanly.
TEST(TpFaults, LoadFailureOnOneRankNamesItOnEveryRank) {
  ThreadGroup g(3);
  std::string leader_error;
  g.run([&](int r) {
    ModelLoadOptions o;
    o.dir = r == 2 ? "/nonexistent/attnres-model" : testing::golden_dir("tiny-a");
    o.require_tokenizer = false;
    o.group = g.comm(r);
    if (r != 0) {
      FollowerOptions fo;
      fo.load = o;
      EXPECT_EQ(follow_leader(fo), 1);
      return;
    }
    auto m = Model::load(o);
    EXPECT_FALSE(m.is_ok());
    if (!m.is_ok()) leader_error = m.status().message();
    send_to_followers(*g.comm(0), LeaderOp::kExit, 1, "");
  });
  EXPECT_NE(leader_error.find("rank 2 of 3: "), std::string::npos) << leader_error;
  EXPECT_NE(leader_error.find("/nonexistent/attnres-model"), std::string::npos) << leader_error;
  EXPECT_EQ(leader_error.find("rank 1 of 3"), std::string::npos) << leader_error;
}

// A bad flag seen only by a follower is reported with its rank when the leader loads the model.
TEST(TpFaults, FollowerOnlyBadThreadsFlagFailsTheLoad) {
  ThreadGroup g(2);
  std::string leader_error;
  g.run([&](int r) {
    ModelLoadOptions o;
    o.dir = testing::golden_dir("tiny-a");
    o.require_tokenizer = false;
    o.group = g.comm(r);
    if (r != 0) {
      FollowerOptions fo;
      fo.load = o;
      fo.threads = -3;
      EXPECT_EQ(follow_leader(fo), 1);
      return;
    }
    auto m = Model::load(o);
    EXPECT_FALSE(m.is_ok());
    if (!m.is_ok()) leader_error = m.status().message();
    send_to_followers(*g.comm(0), LeaderOp::kExit, 1, "");
  });
  EXPECT_NE(leader_error.find("rank 1 of 2: --threads is -3"), std::string::npos) << leader_error;
  set_thread_count(default_thread_count());
}

}  // namespace
}  // namespace attnres
