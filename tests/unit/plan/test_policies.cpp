// Storage policies through the executor: block reuse, preservation of the final committed
// block, the property test of `planned`, plain-residual models, a broken plan, the scaled-down
// lifetime harness, and the executor against a direct (naive) forward in HF order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>

#include "config/config.h"
#include "kernels/attnres.h"
#include "plan/executor.h"
#include "plan/harness.h"
#include "plan/plan.h"
#include "plan/program.h"

namespace attnres {
namespace {

int value_named(const Program& p, const std::string& name) {
  for (size_t v = 0; v < p.values.size(); ++v) {
    if (p.values[v].name == name) return static_cast<int>(v);
  }
  ADD_FAILURE() << "no value " << name;
  return 0;
}

std::string lname(const char* prefix, int layer, const char* suffix) {
  std::string s = prefix;
  s += std::to_string(layer);
  s += suffix;
  return s;
}

TEST(Policies, PlannedPropertyOverRandomShapes) {
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<int> layers(1, 128), block(1, 24);
  for (int n = 0; n < 1000; ++n) {
    const int L = layers(rng), B = block(rng);
    const Program p = build_program(attnres_schedule(L, B));
    const Plan plan = make_plan(p, Policy::kPlanned);
    auto h = verify_plan(p, plan);
    ASSERT_TRUE(h.is_ok()) << h.status().to_string();
    const int lb = lower_bound_buffers(p);
    ASSERT_TRUE(h->empty()) << "L=" << L << " B=" << B << ": " << format_hazard(h->front());
    ASSERT_EQ(plan.num_storages(), lb) << "L=" << L << " B=" << B;
    ASSERT_EQ(peak_live_storages(p, plan), lb) << "L=" << L << " B=" << B;
    // The running sum of block k lives in slot k+1: every commit after layer 0 copies nothing.
    for (const Step& s : p.steps) {
      if (s.commit >= 0) {
        ASSERT_EQ(plan.storage_of[s.commit], plan.storage_of[s.rs_source()]) << s.name;
        ASSERT_EQ(plan.storage_of[s.commit], s.commit_slot) << s.name;
      }
    }
    auto hs = verify_plan(p, make_plan(p, Policy::kSeparate));
    ASSERT_TRUE(hs.is_ok() && hs->empty()) << "separate L=" << L << " B=" << B;
  }
}

// Earlier commits keep the ordinary reuse: under preserve-final the post-attention mixture of
// layers 12..72 still goes into the old running sum's storage (rule 6) and only layer 84 gets
// fresh storage; planned reuses the not-yet-committed slots as scratch and then as the next
// block's running sum.
TEST(Policies, OrdinaryBlockReuseAtEarlierCommits) {
  const Program p = build_program(attnres_schedule(93, 12));
  const Plan pf = make_plan(p, Policy::kPreserveFinal);
  const Plan un = make_plan(p, Policy::kUnrestricted);
  for (int layer = 12; layer <= 72; layer += 12) {
    const int x = value_named(p, lname("x.L", layer, ".mlp"));
    const int old_rs = value_named(p, lname("rsum.L", layer, ".attn"));
    EXPECT_EQ(pf.storage_of[x], pf.storage_of[old_rs]) << layer;
    EXPECT_EQ(pf.storage_of[x], un.storage_of[x]) << layer;
  }
  const int x84 = value_named(p, "x.L84.mlp");
  EXPECT_NE(pf.storage_of[x84], un.storage_of[x84]);
  EXPECT_EQ(pf.num_storages(), un.num_storages() + 1);  // the one extra buffer of the fix
  const Plan planned = make_plan(p, Policy::kPlanned);
  EXPECT_LT(planned.num_storages(), make_plan(p, Policy::kSeparate).num_storages());
  for (int layer = 12; layer <= 72; layer += 12) {
    // Reuse at a commit layer: slot k+1 served as scratch during block k-1 and now becomes the
    // running sum of block k, the attention output written in place over its input.
    const int slot = layer / 12 + 1;
    const int a = value_named(p, lname("attn_out.L", layer, ""));
    const int x = value_named(p, lname("x.L", layer, ".attn"));
    EXPECT_EQ(planned.storage_of[a], slot) << layer;
    EXPECT_EQ(planned.storage_of[x], slot) << layer;
    EXPECT_EQ(planned.storage_of[value_named(p, lname("mlp_out.L", layer - 1, ""))], slot) << layer;
  }
}

// Slot-only plan checks for the final commit layer: the mixture is not written into slot 7.
TEST(Policies, FinalCommitMixtureAvoidsSlot7) {
  const Program p = build_program(attnres_schedule(93, 12));
  const int x84 = value_named(p, "x.L84.mlp");
  EXPECT_NE(make_plan(p, Policy::kPreserveFinal).storage_of[x84], 7);
  EXPECT_NE(make_plan(p, Policy::kPlanned).storage_of[x84], 7);
  EXPECT_EQ(make_plan(p, Policy::kUnrestricted).storage_of[x84], 7);
}

TEST(Policies, VerifierCatchesABrokenPlan) {
  const Program p = build_program(attnres_schedule(30, 6));
  Plan plan = make_plan(p, Policy::kPlanned);
  // Put layer 20's pre-MLP mixture into slot 1, which holds bank[1] (read to the end).
  const int x = value_named(p, "x.L20.mlp");
  plan.storage_of[x] = 1;
  auto h = verify_plan(p, plan);
  ASSERT_TRUE(h.is_ok());
  ASSERT_FALSE(h->empty());
  EXPECT_EQ(h->front().step_name, "L20.pre_mlp");
  EXPECT_EQ(h->front().storage_name, "slot1");
  EXPECT_EQ(h->front().victim_name, "bank[1]");
  EXPECT_EQ(h->front().reader_names.back(), "final");
  // The executor refuses it.
  ExecutorOptions o;
  o.max_tokens = 4;
  o.dim = 16;
  auto ex = Executor::create(p, plan, o);
  ASSERT_FALSE(ex.is_ok());
  EXPECT_EQ(ex.status().code(), ErrorCode::kHazard);
  // A storage id out of range is a structural error.
  plan.storage_of[x] = plan.num_storages();
  EXPECT_EQ(verify_plan(p, plan).status().code(), ErrorCode::kInvalidArgument);
}

// ---- Executor against a direct forward in HF order (k3-model.md §2). ----

template <typename T>
T narrow(float x) {
  if constexpr (std::is_same_v<T, bf16>) {
    return f32_to_bf16(x);
  } else {
    return x;
  }
}
template <typename T>
float widen(T x) {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16_to_f32(x);
  } else {
    return x;
  }
}

template <typename T>
ActView view_of(std::vector<T>& v, int64_t tokens, int64_t d) {
  return ActView{v.data(), std::is_same_v<T, bf16> ? ActDType::kBF16 : ActDType::kF32, tokens, d};
}

// KimiRMSNorm: normalise in f32 (sequential sum), cast, times the gain, cast.
template <typename T>
std::vector<T> norm(const std::vector<T>& h, std::span<const float> w, int64_t tokens, int64_t d,
                    float eps) {
  std::vector<T> y(h.size());
  for (int64_t t = 0; t < tokens; ++t) {
    float ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += widen(h[t * d + j]) * widen(h[t * d + j]);
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
    for (int64_t j = 0; j < d; ++j) {
      y[t * d + j] = narrow<T>(widen(narrow<T>(widen(h[t * d + j]) * inv)) * w[j]);
    }
  }
  return y;
}

template <typename T>
std::vector<T> add(const std::vector<T>& a, const std::vector<T>& b) {
  std::vector<T> y(a.size());
  for (size_t i = 0; i < a.size(); ++i) y[i] = narrow<T>(widen(a[i]) + widen(b[i]));
  return y;
}

template <typename T>
std::vector<T> read(const std::vector<std::vector<T>>& bank, const std::vector<T>& rs,
                    std::span<const float> q, int64_t tokens, int64_t d, float eps) {
  std::vector<const T*> src;
  for (const auto& b : bank) src.push_back(b.data());
  src.push_back(rs.data());
  std::vector<T> out(rs.size());
  attnres_read_ref(src.data(), static_cast<int>(src.size()), tokens, d, q.data(), eps, out.data());
  return out;
}

// h = running_sum; pre-attention read (skipped at layer 0); commit at i % B == 0; attention on
// input_layernorm(h); running sum restarted or added; pre-MLP read; MLP; add; final read; norm.
template <typename T>
std::vector<T> naive_forward(StandInModel& m, int L, int B, int64_t tokens, int64_t d,
                             const std::vector<int32_t>& ids, std::vector<T>* raw_final = nullptr) {
  const ForwardParams& P = m.params();
  std::vector<T> rs(static_cast<size_t>(tokens * d));
  EXPECT_TRUE(m.embed(ids, view_of(rs, tokens, d)).is_ok());
  std::vector<std::vector<T>> bank;
  for (int i = 0; i < L; ++i) {
    const LayerResParams& l = P.layers[static_cast<size_t>(i)];
    std::vector<T> h = rs;
    if (B > 0 && i > 0) h = read(bank, rs, l.attn_query, tokens, d, P.res_eps);
    bool restart = false;
    if (B > 0 && i % B == 0) {
      bank.push_back(rs);
      restart = true;
    }
    std::vector<T> x = norm(h, l.input_layernorm, tokens, d, P.norm_eps);
    std::vector<T> a(x.size());
    EXPECT_TRUE(m.attention(i, view_of(x, tokens, d), view_of(a, tokens, d)).is_ok());
    rs = restart ? a : add(rs, a);
    h = B > 0 ? read(bank, rs, l.mlp_query, tokens, d, P.res_eps) : rs;
    x = norm(h, l.post_attention_layernorm, tokens, d, P.norm_eps);
    std::vector<T> o(x.size());
    EXPECT_TRUE(m.mlp(i, view_of(x, tokens, d), view_of(o, tokens, d)).is_ok());
    rs = add(rs, o);
  }
  std::vector<T> h = B > 0 ? read(bank, rs, P.output_query, tokens, d, P.res_eps) : rs;
  if (raw_final) *raw_final = h;
  return norm(h, P.final_norm, tokens, d, P.norm_eps);
}

template <typename T>
void executor_matches_naive(int L, int B) {
  const int64_t tokens = 5, d = 40;
  const Program p = build_program(attnres_schedule(L, B));
  StandInModel model(L, B > 0, d, 77);
  std::vector<int32_t> ids = {3, 1, 4, 1, 5};
  const std::vector<T> expect = naive_forward<T>(model, L, B, tokens, d, ids);
  for (Policy policy : {Policy::kSeparate, Policy::kPreserveFinal, Policy::kPlanned}) {
    if (!verify_plan(p, make_plan(p, policy))->empty()) continue;  // preserve-final, odd parity
    for (ReadKernel k : {ReadKernel::kReference, ReadKernel::kFused}) {
      ExecutorOptions o;
      o.dtype = std::is_same_v<T, bf16> ? ActDType::kBF16 : ActDType::kF32;
      o.max_tokens = 8;
      o.dim = d;
      o.kernel = k;
      auto ex = Executor::create(p, make_plan(p, policy), o);
      ASSERT_TRUE(ex.is_ok()) << ex.status().to_string();
      ASSERT_TRUE((*ex)->run(model, model.params(), ids).is_ok());
      const ActView out = (*ex)->final_hidden();
      ASSERT_EQ(out.tokens, tokens);
      int64_t diff = 0;
      double worst = 0;
      for (int64_t i = 0; i < tokens * d; ++i) {
        const float a = out.get(i), b = widen(expect[static_cast<size_t>(i)]);
        diff += std::memcmp(&a, &b, sizeof a) != 0;
        worst = std::max(worst, static_cast<double>(std::fabs(a - b)));
      }
      if (k == ReadKernel::kReference) {
        EXPECT_EQ(diff, 0) << policy_name(policy) << " L=" << L << " B=" << B;
      } else {
        // Fused reads: within the kernel bound per read, compounded over the layers.
        EXPECT_LT(worst, 0.1) << policy_name(policy) << " L=" << L << " B=" << B;
      }
    }
  }
}

TEST(Executor, MatchesNaiveForwardBf16) {
  executor_matches_naive<bf16>(30, 4);
  executor_matches_naive<bf16>(7, 1);
  executor_matches_naive<bf16>(5, 12);
}
// capture_raw_mixture hands the observer every read's pre-norm mixture (value -1).
TEST(Executor, CapturesRawMixture) {
  const int L = 10, B = 4;
  const int64_t tokens = 3, d = 24;
  const Program p = build_program(attnres_schedule(L, B));
  StandInModel model(L, true, d, 12);
  const std::vector<int32_t> ids = {5, 6, 7};
  std::vector<bf16> raw_final;
  naive_forward<bf16>(model, L, B, tokens, d, ids, &raw_final);
  ExecutorOptions o;
  o.max_tokens = tokens;
  o.dim = d;
  o.kernel = ReadKernel::kReference;
  o.capture_raw_mixture = true;
  auto ex = Executor::create(p, make_plan(p, Policy::kPlanned), o);
  ASSERT_TRUE(ex.is_ok());
  int raw_reads = 0;
  std::vector<uint16_t> got;
  ASSERT_TRUE((*ex)
                  ->run(model, model.params(), ids,
                        [&](const Step& s, int v, const ActView& view) {
                          if (v != -1) return;
                          ++raw_reads;
                          if (s.kind == StepKind::kFinalRead) {
                            const uint16_t* b = reinterpret_cast<const uint16_t*>(view.data);
                            got.assign(b, b + view.numel());
                          }
                        })
                  .is_ok());
  EXPECT_EQ(raw_reads, 2 * L + 1);
  ASSERT_EQ(got.size(), raw_final.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], raw_final[i].bits) << i;
}

TEST(Executor, MatchesNaiveForwardF32) {
  executor_matches_naive<float>(26, 8);
}
// A model without AttnRes (no attn_res_block_size) plans and runs as h += f(norm(h)).
TEST(Executor, PlainResidualModel) {
  executor_matches_naive<bf16>(9, 0);
  executor_matches_naive<float>(9, 0);
  const Program p = build_program(attnres_schedule(9, 0));
  for (Policy policy : kAllPolicies) {
    auto h = verify_plan(p, make_plan(p, policy));
    ASSERT_TRUE(h.is_ok());
    EXPECT_TRUE(h->empty()) << policy_name(policy);
  }
  EXPECT_EQ(make_plan(p, Policy::kPlanned).num_storages(), lower_bound_buffers(p));
}

// At the final commit layer (84) slot 7 holds bank[7] from its commit to the end of the layer
// (and of the pass) under preserve-final and planned, and not under unrestricted.
TEST(Executor, Slot7UnchangedAfterFinalCommitLayer) {
  const int64_t tokens = 3, d = 32;
  const Program p = build_program(attnres_schedule(93, 12));
  StandInModel model(93, true, d, 5);
  const std::vector<int32_t> ids = {7, 8, 9};
  for (Policy policy : {Policy::kPreserveFinal, Policy::kPlanned, Policy::kUnrestricted}) {
    ExecutorOptions o;
    o.max_tokens = tokens;
    o.dim = d;
    o.allow_hazards = true;
    auto ex = Executor::create(p, make_plan(p, policy), o);
    ASSERT_TRUE(ex.is_ok());
    Executor* e = ex->get();
    std::vector<uint16_t> at_commit, after_layer, at_end;
    auto grab = [&](std::vector<uint16_t>& dst) {
      const ActView v = e->storage_view(7);
      const uint16_t* b = reinterpret_cast<const uint16_t*>(v.data);
      dst.assign(b, b + v.numel());
    };
    ASSERT_TRUE(e->run(model, model.params(), ids, [&](const Step& s, int value, const ActView&) {
                   if (s.name == "L84.pre_attn" && value == s.commit) grab(at_commit);
                   if (s.name == "L84.mlp") grab(after_layer);
                 }).is_ok());
    grab(at_end);
    ASSERT_EQ(at_commit.size(), static_cast<size_t>(tokens * d));
    if (policy == Policy::kUnrestricted) {
      EXPECT_NE(at_commit, after_layer);
    } else {
      EXPECT_EQ(at_commit, after_layer) << policy_name(policy);
      EXPECT_EQ(at_commit, at_end) << policy_name(policy);
    }
  }
}

TEST(Executor, RerunIsIdenticalAndParamsAreChecked) {
  const Program p = build_program(attnres_schedule(13, 4));
  StandInModel model(13, true, 24, 9);
  ExecutorOptions o;
  o.max_tokens = 6;
  o.dim = 24;
  auto ex = Executor::create(p, make_plan(p, Policy::kPlanned), o);
  ASSERT_TRUE(ex.is_ok());
  const std::vector<int32_t> ids = {1, 2, 3, 4};
  ASSERT_TRUE((*ex)->run(model, model.params(), ids).is_ok());
  const ActView a = (*ex)->final_hidden();
  std::vector<uint16_t> first(reinterpret_cast<uint16_t*>(a.data),
                              reinterpret_cast<uint16_t*>(a.data) + a.numel());
  ASSERT_TRUE((*ex)->run(model, model.params(), ids).is_ok());
  EXPECT_EQ(0, std::memcmp(first.data(), (*ex)->final_hidden().data, first.size() * 2));
  ForwardParams bad = model.params();
  bad.layers[3].mlp_query = {};
  const Status st = (*ex)->run(model, bad, ids);
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("layer 3 mlp-residual query"), std::string::npos) << st.message();
  const std::vector<int32_t> too_many(7, 1);
  EXPECT_EQ((*ex)->run(model, model.params(), too_many).code(), ErrorCode::kInvalidArgument);
}

// The fused step keeps its sources in tables of kMaxAttnResSources, checked only by an assert
// in the kernel: the executor refuses a program beyond it (65 sources segfaulted before).
TEST(Executor, RefusesReadsBeyondTheKernelTables) {
  ExecutorOptions o;
  o.max_tokens = 2;
  o.dim = 16;
  const Program fits = build_program(attnres_schedule(kMaxAttnResSources - 1, 1));
  EXPECT_TRUE(Executor::create(fits, make_plan(fits, Policy::kPlanned), o).is_ok());
  const Program over = build_program(attnres_schedule(kMaxAttnResSources, 1));
  auto ex = Executor::create(over, make_plan(over, Policy::kPlanned), o);
  ASSERT_FALSE(ex.is_ok());
  EXPECT_EQ(ex.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(ex.status().message().find("65 sources (64 layers, AttnRes block 1), at most 64"),
            std::string::npos)
      << ex.status().message();
}

// Buffer sizes are products of the capacity and the width: an overflow is an error, not a
// small allocation written far past its end.
TEST(Executor, ArenaSizeArithmeticIsChecked) {
  const Program p = build_program(attnres_schedule(13, 4));
  ExecutorOptions o;
  o.max_tokens = int64_t{1} << 40;
  o.dim = int64_t{1} << 30;
  auto ex = Executor::create(p, make_plan(p, Policy::kPlanned), o);
  ASSERT_FALSE(ex.is_ok());
  EXPECT_EQ(ex.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(ex.status().message().find("do not fit in the address space"), std::string::npos)
      << ex.status().message();
}

TEST(Harness, OptionsAreCheckedAndNamedByTheirFlags) {
  HarnessOptions o;
  o.layers = 757;  // with the default block 12: 64 slots + the running sum
  o.tokens = 16;
  o.hidden = 64;
  Status s = check_harness_options(o);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--layers 757 with --block 12 gives AttnRes reads of up to 65"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(run_harness(o).status().code(), ErrorCode::kInvalidArgument);
  o.layers = 755;  // 63 slots + the running sum: fits
  EXPECT_TRUE(check_harness_options(o).is_ok());
  o.tokens = int64_t{1} << 40;
  EXPECT_NE(check_harness_options(o).message().find("--tokens is 1099511627776"),
            std::string::npos);
  o.tokens = 16;
  o.hidden = int64_t{1} << 40;
  EXPECT_NE(check_harness_options(o).message().find("--hidden is 1099511627776, expected "
                                                    "1..1048576"),
            std::string::npos);
  o.hidden = 64;
  o.layers = 1 << 20;
  o.block = 0;
  EXPECT_NE(check_harness_options(o).message().find("--layers is 1048576, expected 1..65536"),
            std::string::npos);
}

// ---- The lifetime harness, scaled down. ----

// Same parity as the published shape (the last commit follows an even number of blocks), so
// the same hazard as layer 84 appears at layer 24 and every expectation of the full harness
// applies.
TEST(Harness, ScaledDownSameParityAsPublished) {
  HarnessOptions o;
  o.layers = 26;
  o.block = 8;
  o.tokens = 256;
  o.hidden = 512;
  o.reps = 1;
  auto r = run_harness(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  for (const std::string& f : r->failures) ADD_FAILURE() << f;
  EXPECT_TRUE(r->ok());
  EXPECT_EQ(r->output_elements, 256 * 512);
  EXPECT_EQ(r->bank_elements, 4 * 256 * 512);
  const auto& un = r->policies.at(Policy::kUnrestricted);
  ASSERT_EQ(un.hazards.size(), 1u);
  EXPECT_EQ(un.hazards[0].step_name, "L24.pre_mlp");
  EXPECT_EQ(un.hazards[0].storage_name, "slot3");
  EXPECT_GT(un.output_mismatches[0], 0);
  EXPECT_GT(un.bank_mismatches[0], 0);
  for (Policy p : {Policy::kSeparate, Policy::kPreserveFinal, Policy::kPlanned}) {
    EXPECT_EQ(r->policies.at(p).output_mismatches[0], 0) << policy_name(p);
    EXPECT_EQ(r->policies.at(p).bank_mismatches[0], 0) << policy_name(p);
  }
}

// 26 layers, block 12: the last commit follows an odd number of blocks, so under the
// unrestricted rules the running sum sits in the other buffer and the pending output (the
// scratch) in slot 2; the commit at layer 24 and the pre-attention mixture then share slot 2.
// The published fix only covers the post-attention mixture, so preserve-final is hazardous
// here too; planned is not.
TEST(Harness, ScaledDownOddParityDefeatsThePublishedFix) {
  HarnessOptions o;
  o.layers = 26;
  o.block = 12;
  o.tokens = 256;
  o.hidden = 512;
  o.reps = 1;
  auto r = run_harness(o);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_FALSE(r->ok());
  const auto& pf = r->policies.at(Policy::kPreserveFinal);
  ASSERT_EQ(pf.hazards.size(), 1u);
  EXPECT_EQ(pf.hazards[0].step_name, "L24.pre_attn");
  EXPECT_EQ(pf.hazards[0].storage_name, "slot2");
  EXPECT_EQ(pf.hazards[0].victim_name, "bank[2]");
  EXPECT_GT(pf.output_mismatches[0], 0);
  EXPECT_GT(r->policies.at(Policy::kUnrestricted).output_mismatches[0], 0);
  EXPECT_TRUE(r->policies.at(Policy::kPlanned).hazards.empty());
  EXPECT_EQ(r->policies.at(Policy::kPlanned).output_mismatches[0], 0);
  EXPECT_EQ(r->policies.at(Policy::kPlanned).bank_mismatches[0], 0);
  for (const std::string& f : r->failures) {
    EXPECT_EQ(f.rfind("preserve-final", 0), 0u) << f;  // the only unmet expectations
  }
}

}  // namespace
}  // namespace attnres
