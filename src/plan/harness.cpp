// Lifetime harness (harness.h).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <string>

#include "config/config.h"
#include "kernels/attnres.h"
#include "plan/harness.h"

#include <atomic>
#include "plan/standin.h"
#include "util/parallel.h"
#include "util/random.h"

namespace attnres {
namespace {

using Rng = SplitMix64;

uint64_t mix(uint64_t x) {
  Rng r{x};
  return r.next();
}

// Peak resident set (VmHWM) of this process, and its reset (Linux clear_refs "5").
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  return static_cast<bool>(f);
}
size_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

template <typename U>
int64_t count_differences(const U* x, const U* y, int64_t n) {
  std::atomic<int64_t> bad{0};
  parallel_ranges(n, n >= kAttnResParallelMinElements, [&](int64_t b, int64_t e) {
    int64_t local = 0;
    for (int64_t i = b; i < e; ++i) local += x[i] != y[i];
    bad += local;
  });
  return bad.load();
}

// Elements whose bits differ (a and b have the same dtype and shape).
int64_t count_mismatches(const ActView& a, const ActView& b) {
  const int64_t n = a.numel();
  if (a.dtype == ActDType::kBF16) {
    const uint16_t* x = reinterpret_cast<const uint16_t*>(a.data);
    const uint16_t* y = reinterpret_cast<const uint16_t*>(b.data);
    return count_differences(x, y, n);
  }
  const uint32_t* x = reinterpret_cast<const uint32_t*>(a.data);
  const uint32_t* y = reinterpret_cast<const uint32_t*>(b.data);
  return count_differences(x, y, n);
}

int64_t bank_mismatches(const Executor& a, const Executor& b) {
  int64_t bad = 0;
  for (int v : a.program().committed) bad += count_mismatches(a.value_view(v), b.value_view(v));
  return bad;
}

}  // namespace

StandInModel::StandInModel(int layers, bool attnres, int64_t dim, uint64_t seed) : dim_(dim) {
  Rng rng{seed};
  const size_t d = static_cast<size_t>(dim);
  auto vec = [&](float lo, float hi, bool bf16_values) {
    std::vector<float> v(d);
    for (float& x : v) x = bf16_values ? round_bf16(rng.uniform(lo, hi)) : rng.uniform(lo, hi);
    vectors_.push_back(std::move(v));
    return std::span<const float>(vectors_.back());
  };
  vectors_.reserve(static_cast<size_t>(layers) * 4 + 2);
  // Query scale: scores are dot(v / rms(v), q) with unit-RMS entries, so entries of size
  // ~4 / sqrt(d) give scores of a few units: softmax weights far from uniform and from one-hot.
  const float qs = 4.0f / std::sqrt(static_cast<float>(dim));
  params_.res_eps = 1e-5f;
  params_.norm_eps = 1e-5f;
  for (int i = 0; i < layers; ++i) {
    LayerResParams l;
    if (attnres && i > 0) l.attn_query = vec(-qs, qs, false);
    if (attnres) l.mlp_query = vec(-qs, qs, false);
    l.input_layernorm = vec(0.5f, 1.5f, true);
    l.post_attention_layernorm = vec(0.5f, 1.5f, true);
    params_.layers.push_back(l);
    for (auto* subs : {&attn_, &mlp_}) {
      Sub s;
      s.a = rng.uniform(0.2f, 0.6f);
      s.b = rng.uniform(-1.0f, 1.0f);
      s.offset.resize(d);
      for (float& x : s.offset) x = rng.uniform(-0.3f, 0.3f);
      subs->push_back(std::move(s));
    }
  }
  if (attnres) params_.output_query = vec(-qs, qs, false);
  params_.final_norm = vec(0.5f, 1.5f, true);
}

Status StandInModel::embed(std::span<const int32_t> tokens, const ActView& out) {
  const int64_t d = dim_;
  const int64_t T = static_cast<int64_t>(tokens.size());
  parallel_ranges(T, T * d >= kAttnResParallelMinElements, [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      const uint64_t base = mix(static_cast<uint64_t>(tokens[static_cast<size_t>(t)]) << 20);
      for (int64_t j = 0; j < d; ++j) {
        const uint64_t h = mix(base ^ static_cast<uint64_t>(j));
        const float x = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
        if (out.dtype == ActDType::kBF16) {
          out.bf16_data()[t * d + j] = f32_to_bf16(x);
        } else {
          out.f32_data()[t * d + j] = x;
        }
      }
    }
  });
  return Status::ok();
}

Status StandInModel::attention(int layer, const ActView& in, const ActView& out) {
  const Sub& s = attn_[static_cast<size_t>(layer)];
  standin_elementwise(in, out, StandInKind::kAttention, s.a, s.b, s.offset.data());
  return Status::ok();
}

Status StandInModel::mlp(int layer, const ActView& in, const ActView& out) {
  const Sub& s = mlp_[static_cast<size_t>(layer)];
  standin_elementwise(in, out, StandInKind::kMlp, 1.0f - s.a, s.b, s.offset.data());
  return Status::ok();
}

namespace {

Result<HarnessResult> run_harness_checked(const HarnessOptions& o) {
  HarnessResult res;
  res.options = o;
  res.kernel_target = attnres_target_name();
  const Program program = build_program(attnres_schedule(o.layers, o.block));
  res.output_elements = o.tokens * o.hidden;
  res.bank_elements = static_cast<int64_t>(program.bank_slots) * o.tokens * o.hidden;
  res.lower_bound_buffers = lower_bound_buffers(program);
  StandInModel model(o.layers, program.has_attnres(), o.hidden, o.seed);
  std::vector<int32_t> tokens(static_cast<size_t>(o.tokens));
  for (size_t t = 0; t < tokens.size(); ++t) {
    tokens[t] = static_cast<int32_t>((t * 7919 + 13) % 163840);
  }
  ExecutorOptions eo;
  eo.dtype = o.dtype;
  eo.max_tokens = o.tokens;
  eo.dim = o.hidden;
  eo.allow_hazards = true;  // unrestricted runs on purpose

  auto make = [&](Policy p) -> Result<std::unique_ptr<Executor>> {
    return Executor::create(program, make_plan(program, p), eo);
  };
  auto run_timed = [&](Executor& ex, HarnessPolicyResult& pr) -> Status {
    const auto t0 = std::chrono::steady_clock::now();
    ATTNRES_RETURN_IF_ERROR(ex.run(model, model.params(), tokens));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    pr.seconds_per_rep.push_back(s);
    pr.seconds += s;
    return Status::ok();
  };

  for (Policy p : kAllPolicies) {
    HarnessPolicyResult& pr = res.policies[p];
    const Plan plan = make_plan(program, p);
    ATTNRES_ASSIGN_OR_RETURN(pr.hazards, verify_plan(program, plan));
    pr.buffers = plan.num_storages();
  }

  // The first repetition's separate output, to check separate's own reproducibility.
  std::unique_ptr<Executor> first_separate;
  for (int rep = 0; rep < o.reps; ++rep) {
    HarnessPolicyResult& sp = res.policies[Policy::kSeparate];
    reset_peak_rss();
    ATTNRES_ASSIGN_OR_RETURN(std::unique_ptr<Executor> sep, make(Policy::kSeparate));
    ATTNRES_RETURN_IF_ERROR(run_timed(*sep, sp));
    sp.peak_bytes = sep->arena_bytes();
    sp.rss_peak_bytes = std::max(sp.rss_peak_bytes, peak_rss_bytes());
    const Executor& ref0 = first_separate ? *first_separate : *sep;
    sp.output_mismatches.push_back(count_mismatches(sep->final_hidden(), ref0.final_hidden()));
    sp.bank_mismatches.push_back(bank_mismatches(*sep, ref0));
    for (Policy p : {Policy::kUnrestricted, Policy::kPreserveFinal, Policy::kPlanned}) {
      HarnessPolicyResult& pr = res.policies[p];
      reset_peak_rss();
      ATTNRES_ASSIGN_OR_RETURN(std::unique_ptr<Executor> ex, make(p));
      ATTNRES_RETURN_IF_ERROR(run_timed(*ex, pr));
      pr.peak_bytes = ex->arena_bytes();
      pr.rss_peak_bytes = std::max(pr.rss_peak_bytes, peak_rss_bytes());
      pr.output_mismatches.push_back(count_mismatches(ex->final_hidden(), sep->final_hidden()));
      pr.bank_mismatches.push_back(bank_mismatches(*ex, *sep));
    }
    if (!first_separate) first_separate = std::move(sep);
  }

  auto fail = [&](const std::string& m) { res.failures.push_back(m); };
  for (Policy p : {Policy::kSeparate, Policy::kPreserveFinal, Policy::kPlanned}) {
    const HarnessPolicyResult& pr = res.policies[p];
    const std::string name(policy_name(p));
    if (!pr.hazards.empty()) {
      fail(name + ": verifier reports " + std::to_string(pr.hazards.size()) +
           " hazard(s), first: " + format_hazard(pr.hazards.front()));
    }
    for (int r = 0; r < o.reps; ++r) {
      const int64_t om = pr.output_mismatches[static_cast<size_t>(r)];
      const int64_t bm = pr.bank_mismatches[static_cast<size_t>(r)];
      if (om != 0 || bm != 0) {
        fail(name + " rep " + std::to_string(r) + ": " + std::to_string(om) + " output and " +
             std::to_string(bm) + " bank mismatches against separate" +
             (p == Policy::kSeparate ? " (rep 0)" : ""));
      }
    }
  }
  const HarnessPolicyResult& un = res.policies[Policy::kUnrestricted];
  if (un.hazards.empty()) fail("unrestricted: the verifier found no hazard");
  for (int r = 0; r < o.reps; ++r) {
    if (un.output_mismatches[static_cast<size_t>(r)] == 0) {
      fail("unrestricted rep " + std::to_string(r) + ": final output unchanged by the hazard");
    }
  }
  return res;
}

}  // namespace

Status check_harness_options(const HarnessOptions& o) {
  std::string bad;
  auto range = [&](const char* flag, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      bad += std::string("\n  ") + flag + " is " + std::to_string(v) + ", expected " +
             std::to_string(lo) + ".." + std::to_string(hi);
  };
  // The same bounds as a config's num_hidden_layers and hidden_size (config/config.h).
  range("--layers", o.layers, 1, kMaxConfigLayers);
  range("--block", o.block, 0, kMaxConfigLayers);
  range("--tokens", o.tokens, 1, INT32_MAX);
  range("--hidden", o.hidden, 1, kMaxConfigWidth);
  range("--reps", o.reps, 1, 1000000);
  if (bad.empty() && o.block > 0) {
    // The final read sees every bank slot and the running sum (util/limits.h).
    const int64_t sources = (int64_t{o.layers} + o.block - 1) / o.block + 1;
    if (sources > kMaxAttnResSources) {
      const int64_t min_block =
          (int64_t{o.layers} + kMaxAttnResSources - 2) / (kMaxAttnResSources - 1);
      bad += "\n  --layers " + std::to_string(o.layers) + " with --block " +
             std::to_string(o.block) + " gives AttnRes reads of up to " + std::to_string(sources) +
             " sources (ceil(" + std::to_string(o.layers) + " / " + std::to_string(o.block) +
             ") bank slots + the running sum), at most " + std::to_string(kMaxAttnResSources) +
             " are supported (--block >= " + std::to_string(min_block) + " for " +
             std::to_string(o.layers) + " layers)";
    }
  }
  if (bad.empty() && o.tokens > INT64_MAX / 4 / o.hidden)
    bad += "\n  --tokens " + std::to_string(o.tokens) + " x --hidden " + std::to_string(o.hidden) +
           " overflows a 64-bit byte count";
  if (!bad.empty()) return Status(ErrorCode::kInvalidArgument, "harness:" + bad);
  return Status::ok();
}

Result<HarnessResult> run_harness(const HarnessOptions& o) {
  ATTNRES_RETURN_IF_ERROR(check_harness_options(o));
  try {
    return run_harness_checked(o);
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kInternal, "harness: out of memory for " + std::to_string(o.layers) +
                                            " layers of [" + std::to_string(o.tokens) + ", " +
                                            std::to_string(o.hidden) + "] activations");
  }
}

}  // namespace attnres
