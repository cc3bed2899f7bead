// attnres bench: end-to-end prefill and decode speed on a model directory, measured against
// this machine's own limit (a STREAM-style read probe run in the same invocation).
//   bench --model DIR [--prompt-tokens 256] [--gen-tokens 512] [--threads N] [--reps 3]
//         [--dtype bf16|f32] [--json]
// Each repetition starts a fresh session, prefills a deterministic prompt, then decodes
// --gen-tokens greedy tokens (eos ignored). Reported: prefill and decode tokens/s (median of
// the repetitions, with min and max), bytes touched per decoded token (weights read once per
// token: every dense projection, the router, the shared experts and the top-k routed experts
// of each MoE layer, lm_head and one embedding row; plus the recurrent-state and latent-cache
// traffic averaged over the decode), the achieved GB/s and its fraction of the probe's read
// bandwidth, the share of decode time spent in AttnRes reads (timed inside the executor),
// the shares of decode time spent in dense and MXFP4 projection batches with the GB/s each
// streams (Session::projection_stats), and peak resident memory.
#include <sys/resource.h>

#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "io/weights.h"
#include "kernels/stream_probe.h"
#include "runtime/session.h"

namespace attnres::cli {
namespace {

struct BenchArgs {
  std::string model;
  int64_t prompt_tokens = 256;
  int64_t gen_tokens = 512;
  int threads = 0;
  int reps = 3;
  std::string dtype = "bf16";
  bool json = false;
};

int64_t view_bytes(const TensorView& t) {
  return static_cast<int64_t>(t.nbytes);
}
int64_t matrix_bytes(const ExpertMatrix& m) {
  return m.mxfp4 ? view_bytes(m.packed) + view_bytes(m.scale) : view_bytes(m.dense);
}

// Weight bytes one decoded token reads (see the file comment).
int64_t weight_bytes_per_token(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  int64_t b = view_bytes(w.lm_head) + view_bytes(w.final_norm);
  b += c.hidden_size * static_cast<int64_t>(dtype_size(w.embed.dtype));  // one embedding row
  b += static_cast<int64_t>(w.out_res_query.size() * sizeof(float));
  for (const LayerWeights& l : w.layers) {
    b += view_bytes(l.input_norm) + view_bytes(l.post_attn_norm);
    b += static_cast<int64_t>((l.attn_res_query.size() + l.mlp_res_query.size()) * sizeof(float));
    if (l.kda) {
      const KdaWeights& k = *l.kda;
      for (const TensorView* t : {&k.q_proj, &k.k_proj, &k.v_proj, &k.q_conv, &k.k_conv, &k.v_conv,
                                  &k.f_a_proj, &k.f_b_proj, &k.b_proj, &k.g_proj, &k.g_a_proj,
                                  &k.g_b_proj, &k.dt_bias, &k.o_norm, &k.o_proj})
        b += view_bytes(*t);
    }
    if (l.mla) {
      const MlaWeights& m = *l.mla;
      for (const TensorView* t : {&m.q_a_proj, &m.q_a_norm, &m.q_b_proj, &m.q_proj, &m.kv_a_proj,
                                  &m.kv_a_norm, &m.kv_b_proj, &m.g_proj, &m.o_proj})
        b += view_bytes(*t);
    }
    if (l.dense)
      b += view_bytes(l.dense->gate) + view_bytes(l.dense->up) + view_bytes(l.dense->down);
    if (l.moe) {
      const MoeWeights& m = *l.moe;
      for (const TensorView* t : {&m.gate, &m.gate_bias, &m.shared_gate, &m.shared_up,
                                  &m.shared_down, &m.latent_down, &m.latent_norm, &m.latent_up})
        b += view_bytes(*t);
      if (!m.experts.empty()) {
        const ExpertWeights& e = m.experts.front();  // all experts have the same size
        b += c.num_experts_per_token *
             (matrix_bytes(e.w1) + matrix_bytes(e.w2) + matrix_bytes(e.w3));
      }
    }
  }
  return b;
}

// Recurrent-state and latent-cache bytes one decoded token reads and writes at context length
// `ctx`: each KDA layer reads and writes its fp32 state [H, dk, dv] and conv state; each MLA
// layer reads ctx cached latents [kv_lora + rope] and appends one.
int64_t state_bytes_per_token(const ModelConfig& c, int64_t ctx, int64_t cache_elem_bytes) {
  const int64_t H = c.linear.num_heads, dk = c.linear.head_dim;
  const int64_t kda_state =
      H * dk * dk * 4 + 3 * H * dk * (c.linear.short_conv_kernel_size - 1) * 4;
  const int64_t mla_row = (c.kv_lora_rank + c.qk_rope_head_dim) * cache_elem_bytes;
  return c.schedule.num_kda * 2 * kda_state + c.schedule.num_mla * (ctx + 1) * mla_row;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int run_bench(const BenchArgs& a) {
  if (a.threads > 0) omp_set_num_threads(a.threads);
  if (a.prompt_tokens < 1 || a.gen_tokens < 1 || a.reps < 1)
    return fail("bench: --prompt-tokens, --gen-tokens and --reps must be >= 1");
  if (a.dtype != "bf16" && a.dtype != "f32")
    return fail("bench: --dtype is '" + a.dtype + "', expected bf16 or f32");
  const auto t_load = std::chrono::steady_clock::now();
  auto weights = load_model(a.model);
  if (!weights) return fail(weights.status().to_string());
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count();
  const ModelConfig& c = weights->config;
  if (a.prompt_tokens + a.gen_tokens > 1 << 24) return fail("bench: context too long");

  auto stream = stream_probe();
  if (!stream) return fail(stream.status().to_string());

  // Deterministic prompt over the vocabulary (the top 8 ids, where specials live, avoided).
  std::vector<int32_t> prompt(static_cast<size_t>(a.prompt_tokens));
  uint64_t x = 0x2545f4914f6cdd1dull;
  const int64_t span = std::max<int64_t>(1, c.vocab_size - 8);
  for (auto& t : prompt) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = static_cast<int32_t>(x % static_cast<uint64_t>(span));
  }

  SessionOptions so;
  so.forward.act = a.dtype == "f32" ? ActDType::kF32 : ActDType::kBF16;
  std::vector<double> prefill_tps, decode_tps, attnres_share;
  std::vector<double> dense_share, dense_gb_s, mxfp4_share, mxfp4_gb_s;
  std::vector<float> logits;
  std::vector<float> row(static_cast<size_t>(c.vocab_size));
  for (int r = 0; r < a.reps; ++r) {
    auto session = Session::create(*weights, so);
    if (!session) return fail(session.status().to_string());
    Session& s = **session;

    const auto t0 = std::chrono::steady_clock::now();
    if (Status st = s.prefill(prompt, /*all_logits=*/false, logits); !st.is_ok())
      return fail(st.to_string());
    const auto t1 = std::chrono::steady_clock::now();
    int32_t next = argmax(logits);
    const double read_before = s.attnres_read_seconds();
    const ProjectionStats proj_before = s.projection_stats();
    for (int64_t g = 0; g < a.gen_tokens; ++g) {
      if (Status st = s.decode(next, row); !st.is_ok()) return fail(st.to_string());
      next = argmax(row);
    }
    const auto t2 = std::chrono::steady_clock::now();
    const double pf = std::chrono::duration<double>(t1 - t0).count();
    const double dc = std::chrono::duration<double>(t2 - t1).count();
    prefill_tps.push_back(static_cast<double>(a.prompt_tokens) / pf);
    decode_tps.push_back(static_cast<double>(a.gen_tokens) / dc);
    attnres_share.push_back((s.attnres_read_seconds() - read_before) / dc);
    const ProjectionStats& p = s.projection_stats();
    const double ds = p.dense_seconds - proj_before.dense_seconds;
    const double qs = p.mxfp4_seconds - proj_before.mxfp4_seconds;
    dense_share.push_back(ds / dc);
    mxfp4_share.push_back(qs / dc);
    dense_gb_s.push_back(
        ds > 0 ? static_cast<double>(p.dense_bytes - proj_before.dense_bytes) / ds * 1e-9 : 0.0);
    mxfp4_gb_s.push_back(
        qs > 0 ? static_cast<double>(p.mxfp4_bytes - proj_before.mxfp4_bytes) / qs * 1e-9 : 0.0);
  }

  const int64_t cache_elem = a.dtype == "f32" ? 4 : 2;
  const int64_t weight_bpt = weight_bytes_per_token(*weights);
  const int64_t state_bpt =
      state_bytes_per_token(c, a.prompt_tokens + a.gen_tokens / 2, cache_elem);
  const int64_t bpt = weight_bpt + state_bpt;
  const double decode_med = median(decode_tps);
  const double achieved_gb_s = static_cast<double>(bpt) * decode_med / 1e9;
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const int64_t peak_rss = static_cast<int64_t>(ru.ru_maxrss) * 1024;

  nlohmann::json j = {
      {"model", a.model},
      {"dtype", a.dtype},
      {"threads", omp_get_max_threads()},
      {"prompt_tokens", a.prompt_tokens},
      {"gen_tokens", a.gen_tokens},
      {"reps", a.reps},
      {"load_seconds", load_s},
      {"prefill_tok_s", median(prefill_tps)},
      {"prefill_tok_s_min", *std::min_element(prefill_tps.begin(), prefill_tps.end())},
      {"prefill_tok_s_max", *std::max_element(prefill_tps.begin(), prefill_tps.end())},
      {"decode_tok_s", decode_med},
      {"decode_tok_s_min", *std::min_element(decode_tps.begin(), decode_tps.end())},
      {"decode_tok_s_max", *std::max_element(decode_tps.begin(), decode_tps.end())},
      {"bytes_per_token", bpt},
      {"weight_bytes_per_token", weight_bpt},
      {"state_bytes_per_token", state_bpt},
      {"achieved_gb_s", achieved_gb_s},
      {"stream_gb_s", stream->read_gb_s},
      {"stream_copy_gb_s", stream->copy_gb_s},
      {"stream_triad_gb_s", stream->triad_gb_s},
      {"roofline_fraction", achieved_gb_s / stream->read_gb_s},
      {"attnres_share", median(attnres_share)},
      {"dense_proj_share", median(dense_share)},
      {"dense_proj_gb_s", median(dense_gb_s)},
      {"mxfp4_proj_share", median(mxfp4_share)},
      {"mxfp4_proj_gb_s", median(mxfp4_gb_s)},
      {"peak_rss_bytes", peak_rss},
  };
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("model          %s (%s, %d threads)\n", a.model.c_str(), a.dtype.c_str(),
              omp_get_max_threads());
  std::printf("workload       %lld prompt + %lld generated tokens, %d reps (median [min, max])\n",
              static_cast<long long>(a.prompt_tokens), static_cast<long long>(a.gen_tokens),
              a.reps);
  std::printf("prefill        %.1f tok/s [%.1f, %.1f]\n", median(prefill_tps),
              j["prefill_tok_s_min"].get<double>(), j["prefill_tok_s_max"].get<double>());
  std::printf("decode         %.2f tok/s [%.2f, %.2f]\n", decode_med,
              j["decode_tok_s_min"].get<double>(), j["decode_tok_s_max"].get<double>());
  std::printf("bytes/token    %.1f MB (weights %.1f MB, state and cache %.1f MB)\n",
              static_cast<double>(bpt) / 1e6, static_cast<double>(weight_bpt) / 1e6,
              static_cast<double>(state_bpt) / 1e6);
  std::printf("bandwidth      %.2f GB/s achieved, STREAM read %.2f GB/s -> %.1f%% of roofline\n",
              achieved_gb_s, stream->read_gb_s, 100.0 * achieved_gb_s / stream->read_gb_s);
  std::printf("AttnRes reads  %.2f%% of decode time\n", 100.0 * median(attnres_share));
  std::printf(
      "projections    dense %.1f%% of decode time (%.2f GB/s), MXFP4 experts %.1f%% (%.2f GB/s), "
      "rest %.1f%%\n",
      100.0 * median(dense_share), median(dense_gb_s), 100.0 * median(mxfp4_share),
      median(mxfp4_gb_s), 100.0 * (1.0 - median(dense_share) - median(mxfp4_share)));
  std::printf("peak RSS       %.2f GB (weights are memory-mapped)\n",
              static_cast<double>(peak_rss) / 1e9);
  return 0;
}

const CommandRegistration kReg(
    "bench", "Prefill/decode speed against the machine's measured bandwidth", [](CLI::App* sub) {
      auto a = std::make_shared<BenchArgs>();
      sub->add_option("--model", a->model, "Model directory")->required();
      sub->add_option("--prompt-tokens", a->prompt_tokens, "Prompt length (default 256)");
      sub->add_option("--gen-tokens", a->gen_tokens, "Generated tokens (default 512)");
      sub->add_option("--threads", a->threads, "OpenMP threads (default: all cores)");
      sub->add_option("--reps", a->reps, "Repetitions; median reported (default 3)");
      sub->add_option("--dtype", a->dtype, "Activation dtype: bf16 (default) or f32");
      sub->add_flag("--json", a->json, "Machine-readable output");
      return CommandRun([a] { return run_bench(*a); });
    });

}  // namespace
}  // namespace attnres::cli
