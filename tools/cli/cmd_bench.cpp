// attnres bench: end-to-end prefill and decode speed on a model directory, measured against
// this machine's own limit (a STREAM-style read probe run in the same invocation), through the
// batched engine.
//   bench --model DIR [--prompt-tokens 256] [--gen-tokens N] [--threads N] [--reps 3]
//         [--dtype bf16|f32] [--concurrency 1,2,4,8,16] [--json]
// Without --concurrency: each repetition starts a fresh engine, runs a warm-up request on it (a
// distinct prompt of the same length, one token), prefills a deterministic prompt, then decodes
// --gen-tokens (default 512) greedy tokens (eos ignored). Reported: prefill and decode tokens/s
// (median of the repetitions, with min and max), the warm-up's prefill rate (a fresh engine's
// first request, which faults in the step arena's pages), bytes touched per decoded token
// (weights read once per token: every dense projection, the router, the shared experts and the
// top-k routed experts of each MoE layer, lm_head and one embedding row; plus the
// recurrent-state and latent-cache traffic averaged over the decode), the achieved GB/s and its
// fraction of the probe's read bandwidth (the better of a probe before and one after the
// repetitions; and, as context, the mean of read passes run after each repetition: what a
// sustained stream got at the time; a warning, and `probe_below_decode` in the JSON, when the
// probes read less than decode itself streamed), the share of decode time spent in AttnRes reads,
// the shares of decode time spent in dense and MXFP4 projection batches with the GB/s each streams,
// the rest of decode time (its share and milliseconds per token), the prefill's floating-point
// work against the compute peak of its dot-product instruction (the better of a probe before and
// one after the repetitions) and its split by phase, and peak resident memory.
// With --concurrency: for each N, N sequences with distinct prompts (--prompt-tokens, and
// --gen-tokens default 128) run together; measured while all N decode (from the last first
// token to the first finish): aggregate and per-sequence decode tok/s, the median time to first
// token, weight bytes read per step (dense and MXFP4 apart: the union of the routed experts
// grows with N) and the fraction of the bandwidth roofline for that step's bytes.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "attnres/bench.h"
#include "command.h"
#include "frontend.h"

namespace attnres::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchArgs {
  ModelArgs model;
  int64_t prompt_tokens = 256;
  int64_t gen_tokens = 0;  // 0: 512, or 128 with --concurrency
  int reps = 3;
  std::string concurrency;
  bool json = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A deterministic prompt over the vocabulary (the top 8 ids, where specials live, avoided);
// `stream` makes distinct prompts.
std::vector<int32_t> bench_prompt(int64_t n, int64_t vocab, uint64_t stream) {
  std::vector<int32_t> prompt(static_cast<size_t>(n));
  uint64_t x = 0x2545f4914f6cdd1dull ^ (stream * 0x9e3779b97f4a7c15ull);
  const int64_t span = std::max<int64_t>(1, vocab - 8);
  for (auto& t : prompt) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = static_cast<int32_t>(x % static_cast<uint64_t>(span));
  }
  return prompt;
}

GenerationRequest bench_request(std::vector<int32_t> prompt, int64_t gen) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.max_new_tokens = gen;
  r.ignore_eos = true;
  return r;
}

// Peak resident memory since the last reset_peak_rss() (Linux: VmHWM, which writing 5 to
// /proc/self/clear_refs resets), else since the process started (getrusage). The resets keep the
// bench's own probe arrays out of the figure, which is the model's and the engine's.
int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "N kB"
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";  // best effort: unwritable leaves the peak as is
}

// One repetition of the single-sequence benchmark: prefill and `gen` decode steps.
struct SingleRun {
  double prefill_tps = 0, decode_tps = 0, attnres_share = 0;
  double cold_prefill_tps = 0;  // the engine's first request (see single_run)
  double dense_share = 0, dense_gb_s = 0, mxfp4_share = 0, mxfp4_gb_s = 0;
  // Prefill (to the first token) by phase: share of its time and arithmetic rate; `rest` is
  // everything outside the projection batches (attention, KDA, norms, AttnRes, routing), its
  // rate the model's remaining work (prefill_flops_per_token less the projections') over it.
  double prefill_dense_share = 0, prefill_dense_gflop_s = 0, prefill_mxfp4_share = 0,
         prefill_mxfp4_gflop_s = 0, prefill_rest_gflop_s = 0;
  // Tensor parallelism, per decoded token: collectives, gathered bytes, share of decode time
  // spent in collectives (waiting included).
  double collectives_per_token = 0, gathers_per_token = 0, gather_bytes_per_token = 0,
         comm_share = 0;
};

Result<SingleRun> single_run(std::shared_ptr<const Model> model, const EngineOptions& eo,
                             const std::vector<int32_t>& prompt, int64_t gen,
                             double prefill_flops) {
  EngineOptions o = eo;
  o.max_sequences = 1;
  ATTNRES_ASSIGN_OR_RETURN(auto engine, Engine::create(model, o));
  SingleRun r;
  // A fresh engine's first step faults in the pages of its step arena (the activations of a
  // 256-token prompt: tens of MB), which a serving engine pays once. So the timed request
  // follows a warm-up request on the same engine, as llama-bench warms up: a distinct prompt of
  // the same length (no prefix in common), one token. Its prefill rate is reported as the cold
  // one, what the first request after start sees.
  {
    GenerationResult warm;
    GenerationCallbacks wcb;
    wcb.on_finish = [&](GenerationResult&& w) { warm = std::move(w); };
    const int64_t vocab = model->info().vocab_size;
    ATTNRES_RETURN_IF_ERROR(
        engine
            ->submit(bench_request(bench_prompt(static_cast<int64_t>(prompt.size()), vocab, 1), 1),
                     std::move(wcb))
            .status());
    ATTNRES_RETURN_IF_ERROR(engine->run());
    if (warm.reason == FinishReason::kError) return warm.error;
    r.cold_prefill_tps = static_cast<double>(prompt.size()) / warm.ttft_seconds;
  }
  const EngineStats base = engine->stats();  // the timed request's figures are taken from here
  EngineStats at_first;
  bool first = true;
  GenerationResult res;
  GenerationCallbacks cb;
  cb.on_token = [&](const TokenEvent&) {
    if (first) at_first = engine->stats();
    first = false;
  };
  cb.on_finish = [&](GenerationResult&& done) { res = std::move(done); };
  ATTNRES_RETURN_IF_ERROR(engine->submit(bench_request(prompt, gen + 1), std::move(cb)).status());
  ATTNRES_RETURN_IF_ERROR(engine->run());
  if (res.reason == FinishReason::kError) return res.error;
  const EngineStats& end = engine->stats();
  const double dc = res.decode_seconds;
  r.prefill_tps = static_cast<double>(prompt.size()) / res.ttft_seconds;
  {  // the stats from the warm-up's end to the first token are the prefill's
    const double pt = res.ttft_seconds, pd = at_first.dense_seconds - base.dense_seconds,
                 pq = at_first.mxfp4_seconds - base.mxfp4_seconds;
    const double dense_flops = at_first.dense_flops - base.dense_flops,
                 mxfp4_flops = at_first.mxfp4_flops - base.mxfp4_flops;
    const double rest_s = pt - pd - pq;
    const double rest_flops =
        prefill_flops * static_cast<double>(prompt.size()) - dense_flops - mxfp4_flops;
    r.prefill_dense_share = pd / pt;
    r.prefill_mxfp4_share = pq / pt;
    r.prefill_dense_gflop_s = pd > 0 ? dense_flops / pd * 1e-9 : 0;
    r.prefill_mxfp4_gflop_s = pq > 0 ? mxfp4_flops / pq * 1e-9 : 0;
    r.prefill_rest_gflop_s = rest_s > 0 && rest_flops > 0 ? rest_flops / rest_s * 1e-9 : 0;
  }
  r.decode_tps = static_cast<double>(gen) / dc;
  r.attnres_share = (end.attnres_read_seconds - at_first.attnres_read_seconds) / dc;
  const double ds = end.dense_seconds - at_first.dense_seconds;
  const double qs = end.mxfp4_seconds - at_first.mxfp4_seconds;
  r.dense_share = ds / dc;
  r.mxfp4_share = qs / dc;
  r.dense_gb_s =
      ds > 0 ? static_cast<double>(end.dense_bytes - at_first.dense_bytes) / ds * 1e-9 : 0;
  r.mxfp4_gb_s =
      qs > 0 ? static_cast<double>(end.mxfp4_bytes - at_first.mxfp4_bytes) / qs * 1e-9 : 0;
  const auto g = static_cast<double>(gen);
  r.collectives_per_token = static_cast<double>(end.collectives - at_first.collectives) / g;
  r.gathers_per_token = static_cast<double>(end.gathers - at_first.gathers) / g;
  r.gather_bytes_per_token = static_cast<double>(end.gather_bytes - at_first.gather_bytes) / g;
  r.comm_share = (end.comm_seconds - at_first.comm_seconds) / dc;
  return r;
}

// Seconds of read passes after each repetition (the sustained-read figure).
constexpr double kSustainedReadSeconds = 0.5;

// The better of two probes of the same machine (bandwidth field by field).
MemoryBandwidth best_of(const MemoryBandwidth& x, const MemoryBandwidth& y) {
  MemoryBandwidth b = x;
  b.read_gb_s = std::max(x.read_gb_s, y.read_gb_s);
  b.copy_gb_s = std::max(x.copy_gb_s, y.copy_gb_s);
  b.triad_gb_s = std::max(x.triad_gb_s, y.triad_gb_s);
  return b;
}
const ComputePeak& best_of(const ComputePeak& x, const ComputePeak& y) {
  return y.gflop_s > x.gflop_s ? y : x;
}

int run_single(const BenchArgs& a, std::shared_ptr<const Model> model, const EngineOptions& eo,
               const MemoryBandwidth& stream_before, const ComputePeak& peak_before,
               double load_s) {
  const int64_t gen = a.gen_tokens > 0 ? a.gen_tokens : 512;
  const ModelInfo& info = model->info();
  const std::vector<int32_t> prompt = bench_prompt(a.prompt_tokens, info.vocab_size, 0);
  const double prefill_flops = prefill_flops_per_token(*model, a.prompt_tokens);
  std::vector<double> prefill_tps, cold_prefill_tps, decode_tps, attnres_share, dense_share,
      dense_gb_s, mxfp4_share, mxfp4_gb_s, comm_share, sustained_gb_s;
  std::vector<SingleRun> runs;  // reps >= 1
  int64_t peak_rss = 0;         // over the repetitions (not the read passes between them)
  for (int r = 0; r < a.reps; ++r) {
    auto run = single_run(model, eo, prompt, gen, prefill_flops);
    if (!run) return fail(run.status().to_string());
    prefill_tps.push_back(run->prefill_tps);
    cold_prefill_tps.push_back(run->cold_prefill_tps);
    decode_tps.push_back(run->decode_tps);
    attnres_share.push_back(run->attnres_share);
    dense_share.push_back(run->dense_share);
    dense_gb_s.push_back(run->dense_gb_s);
    mxfp4_share.push_back(run->mxfp4_share);
    mxfp4_gb_s.push_back(run->mxfp4_gb_s);
    comm_share.push_back(run->comm_share);
    runs.push_back(*run);
    peak_rss = std::max(peak_rss, peak_rss_bytes());
    // Paired in time with the repetition: the probe's best pass is the roofline, this mean is
    // what a sustained stream got on the machine at the time (shared machines drift).
    auto sustained = measure_sustained_read(kSustainedReadSeconds);
    if (!sustained) return fail(sustained.status().to_string());
    sustained_gb_s.push_back(*sustained);
    reset_peak_rss();
  }
  // The roofline is the better of the probes before and after the repetitions: the machine's
  // bandwidth drifts, and a probe taken at a slow moment would flatter the decode.
  auto stream_after = measure_memory_bandwidth();
  if (!stream_after) return fail(stream_after.status().to_string());
  const MemoryBandwidth stream = best_of(stream_before, *stream_after);
  // Likewise the compute peak: a probe during which the OS ran other work on one of our cores
  // reads low (about half, on two threads) and would flatter the prefill.
  const ComputePeak peak_after = measure_compute_peak(eo.activation == ActivationType::kBF16);
  const ComputePeak& peak = best_of(peak_before, peak_after);
  const int64_t cache_elem = a.model.dtype == "f32" ? 4 : 2;
  const int64_t weight_bpt = decode_weight_bytes_per_token(*model);
  const int64_t state_bpt =
      decode_state_bytes_per_token(*model, a.prompt_tokens + gen / 2, cache_elem);
  const int64_t bpt = weight_bpt + state_bpt;
  const double decode_med = median(decode_tps);
  const double achieved_gb_s = static_cast<double>(bpt) * decode_med / 1e9;
  // Decode cannot stream faster than the machine reads: when the probes read less than decode
  // itself streamed, something else held the memory bus (or our cores) while they ran, and the
  // roofline fraction overstates. Reported, not corrected: no figure of the run replaces them.
  const bool probe_below_decode = achieved_gb_s > stream.read_gb_s;
  const double sustained_med = median(sustained_gb_s);
  const double dense_gb_s_med = median(dense_gb_s), mxfp4_gb_s_med = median(mxfp4_gb_s);
  const auto [pmin, pmax] = std::minmax_element(prefill_tps.begin(), prefill_tps.end());
  const SingleRun& last = runs.back();
  const double prefill_med = median(prefill_tps);
  const double prefill_gflop_s = prefill_med * prefill_flops * 1e-9;
  // The prefill phase split of the repetition with the median prefill speed.
  const SingleRun& pmed =
      *std::min_element(runs.begin(), runs.end(), [&](const auto& x, const auto& y) {
        return std::abs(x.prefill_tps - prefill_med) < std::abs(y.prefill_tps - prefill_med);
      });
  const double prefill_rest_share = 1.0 - pmed.prefill_dense_share - pmed.prefill_mxfp4_share;
  const auto [dmin, dmax] = std::minmax_element(decode_tps.begin(), decode_tps.end());
  // Decode time outside the projection batches: norms, attention, the KDA state update, routing,
  // activations, the inputs' bf16 copies, sampling.
  const double decode_rest_share = 1.0 - median(dense_share) - median(mxfp4_share);
  const double decode_rest_ms = 1e3 * decode_rest_share / decode_med;
  const nlohmann::json j = {
      {"model", a.model.model},
      {"dtype", a.model.dtype},
      {"threads", thread_count()},
      {"ranks", info.ranks},
      {"rank_weight_bytes", info.rank_weight_bytes},
      {"rank_replicated_bytes", info.rank_replicated_bytes},
      {"rank_copy_bytes", info.rank_copy_bytes},
      {"collectives_per_token", last.collectives_per_token},
      {"gathers_per_token", last.gathers_per_token},
      {"gather_bytes_per_token", last.gather_bytes_per_token},
      {"comm_share", median(comm_share)},
      {"prompt_tokens", a.prompt_tokens},
      {"gen_tokens", gen},
      {"reps", a.reps},
      {"load_seconds", load_s},
      {"prefill_tok_s", prefill_med},
      {"prefill_tok_s_min", *pmin},
      {"prefill_tok_s_max", *pmax},
      {"prefill_cold_tok_s", median(cold_prefill_tps)},
      {"prefill_flops_per_token", prefill_flops},
      {"peak_gflops", peak.gflop_s},
      {"peak_gflops_before", peak_before.gflop_s},
      {"peak_gflops_after", peak_after.gflop_s},
      {"peak_instruction", peak.instruction},
      {"prefill_compute_fraction", prefill_gflop_s / peak.gflop_s},
      {"prefill_dense_share", pmed.prefill_dense_share},
      {"prefill_dense_gflop_s", pmed.prefill_dense_gflop_s},
      {"prefill_mxfp4_share", pmed.prefill_mxfp4_share},
      {"prefill_mxfp4_gflop_s", pmed.prefill_mxfp4_gflop_s},
      {"prefill_rest_share", prefill_rest_share},
      {"prefill_rest_gflop_s", pmed.prefill_rest_gflop_s},
      {"decode_tok_s", decode_med},
      {"decode_tok_s_min", *dmin},
      {"decode_tok_s_max", *dmax},
      {"bytes_per_token", bpt},
      {"weight_bytes_per_token", weight_bpt},
      {"state_bytes_per_token", state_bpt},
      {"achieved_gb_s", achieved_gb_s},
      {"stream_gb_s", stream.read_gb_s},
      {"stream_gb_s_before", stream_before.read_gb_s},
      {"stream_gb_s_after", stream_after->read_gb_s},
      {"stream_copy_gb_s", stream.copy_gb_s},
      {"stream_triad_gb_s", stream.triad_gb_s},
      {"roofline_fraction", achieved_gb_s / stream.read_gb_s},
      {"probe_below_decode", probe_below_decode},
      {"sustained_read_gb_s", sustained_med},
      {"sustained_read_fraction", achieved_gb_s / sustained_med},
      {"attnres_share", median(attnres_share)},
      {"dense_proj_share", median(dense_share)},
      {"dense_proj_gb_s", dense_gb_s_med},
      {"dense_proj_roofline_fraction", dense_gb_s_med / stream.read_gb_s},
      {"mxfp4_proj_share", median(mxfp4_share)},
      {"mxfp4_proj_gb_s", mxfp4_gb_s_med},
      {"mxfp4_proj_roofline_fraction", mxfp4_gb_s_med / stream.read_gb_s},
      {"decode_rest_share", decode_rest_share},
      {"decode_rest_ms_per_token", decode_rest_ms},
      {"peak_rss_bytes", peak_rss},
      {"weights_in_memory_bytes", info.bytes_in_memory},
      {"weights_huge_page_bytes", info.bytes_in_memory_huge},
  };
  if (a.json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("model          %s (%s, %d threads, %d rank%s)\n", a.model.model.c_str(),
              a.model.dtype.c_str(), thread_count(), info.ranks, info.ranks > 1 ? "s" : "");
  std::printf("workload       %lld prompt + %lld generated tokens, %d reps (median [min, max])\n",
              static_cast<long long>(a.prompt_tokens), static_cast<long long>(gen), a.reps);
  std::printf("prefill        %.1f tok/s [%.1f, %.1f]; a fresh engine's first request %.1f tok/s\n",
              prefill_med, *pmin, *pmax, median(cold_prefill_tps));
  std::printf(
      "prefill work   %.3f GFLOP/token -> %.1f GFLOP/s, %.1f%% of the %s peak %.1f GFLOP/s (best "
      "of the probes before and after the reps: %.1f, %.1f)\n",
      prefill_flops * 1e-9, prefill_gflop_s, 100.0 * prefill_gflop_s / peak.gflop_s,
      peak.instruction.c_str(), peak.gflop_s, peak_before.gflop_s, peak_after.gflop_s);
  std::printf(
      "prefill split  dense %.1f%% of prefill time (%.1f GFLOP/s, %.1f%% of peak), MXFP4 experts "
      "%.1f%% (%.1f GFLOP/s, %.1f%%), rest %.1f%% (%.1f GFLOP/s, %.1f%%)\n",
      100.0 * pmed.prefill_dense_share, pmed.prefill_dense_gflop_s,
      100.0 * pmed.prefill_dense_gflop_s / peak.gflop_s, 100.0 * pmed.prefill_mxfp4_share,
      pmed.prefill_mxfp4_gflop_s, 100.0 * pmed.prefill_mxfp4_gflop_s / peak.gflop_s,
      100.0 * prefill_rest_share, pmed.prefill_rest_gflop_s,
      100.0 * pmed.prefill_rest_gflop_s / peak.gflop_s);
  std::printf("decode         %.2f tok/s [%.2f, %.2f]\n", decode_med, *dmin, *dmax);
  std::printf("bytes/token    %.1f MB (weights %.1f MB, state and cache %.1f MB)\n",
              static_cast<double>(bpt) / 1e6, static_cast<double>(weight_bpt) / 1e6,
              static_cast<double>(state_bpt) / 1e6);
  std::printf(
      "bandwidth      %.2f GB/s achieved, STREAM read %.2f GB/s (best of the probes before and "
      "after the reps: %.2f, %.2f) -> %.1f%% of roofline\n",
      achieved_gb_s, stream.read_gb_s, stream_before.read_gb_s, stream_after->read_gb_s,
      100.0 * achieved_gb_s / stream.read_gb_s);
  if (probe_below_decode)
    std::printf(
        "warning        the probes read less than decode streamed: other work held the memory "
        "bus while they ran, so the roofline fraction overstates; run again\n");
  std::printf(
      "sustained read %.2f GB/s (mean of %.1f s of read passes after each rep) -> decode at "
      "%.1f%% of it\n",
      sustained_med, kSustainedReadSeconds, 100.0 * achieved_gb_s / sustained_med);
  std::printf("AttnRes reads  %.2f%% of decode time\n", 100.0 * median(attnres_share));
  std::printf(
      "projections    dense %.1f%% of decode time (%.2f GB/s, %.1f%% of STREAM read), MXFP4 "
      "experts %.1f%% (%.2f GB/s, %.1f%%), rest %.1f%% (%.2f ms per token)\n",
      100.0 * median(dense_share), dense_gb_s_med, 100.0 * dense_gb_s_med / stream.read_gb_s,
      100.0 * median(mxfp4_share), mxfp4_gb_s_med, 100.0 * mxfp4_gb_s_med / stream.read_gb_s,
      100.0 * decode_rest_share, decode_rest_ms);
  if (info.ranks > 1)
    std::printf(
        "ranks          %d: %.1f collectives/token (%.1f gathers), %.2f MB gathered/token, "
        "%.1f%% of decode time in collectives; rank 0 weights %.1f MB (%.1f MB replicated) + "
        "%.1f MB of copies\n",
        info.ranks, last.collectives_per_token, last.gathers_per_token,
        last.gather_bytes_per_token / 1e6, 100.0 * median(comm_share),
        static_cast<double>(info.rank_weight_bytes) / 1e6,
        static_cast<double>(info.rank_replicated_bytes) / 1e6,
        static_cast<double>(info.rank_copy_bytes) / 1e6);
  std::printf("peak RSS       %.2f GB (rank 0)\n", static_cast<double>(peak_rss) / 1e9);
  if (info.bytes_in_memory > 0)
    std::printf("weight pages   %.2f of %.2f GB in memory on transparent huge pages (rank 0)\n",
                static_cast<double>(info.bytes_in_memory_huge) / 1e9,
                static_cast<double>(info.bytes_in_memory) / 1e9);
  else
    std::printf("weight pages   the file mapping (--mmap): 4 KiB pages\n");
  return 0;
}

// N sequences together; measured while all N decode.
struct ConcurrentRun {
  int n = 0;
  double aggregate_tps = 0, per_seq_tps = 0, ttft_s = 0;
  int64_t dense_bytes_per_step = 0, mxfp4_bytes_per_step = 0, bytes_per_step = 0;
  double roofline_fraction = 0;
  double dense_gb_s = 0, mxfp4_gb_s = 0, dense_share = 0, mxfp4_share = 0;
  double dense_gflop_s = 0, mxfp4_gflop_s = 0;  // arithmetic rate inside each phase
};

Result<ConcurrentRun> concurrent_run(std::shared_ptr<const Model> model, const EngineOptions& eo,
                                     int n, int64_t prompt_len, int64_t gen, int64_t cache_elem,
                                     double probe_gb_s) {
  EngineOptions o = eo;
  o.max_sequences = n;
  ATTNRES_ASSIGN_OR_RETURN(auto engine, Engine::create(model, o));
  std::vector<Clock::time_point> token_times;
  std::vector<double> ttft;
  int firsts = 0;
  bool window_open = false, window_closed = false;
  EngineStats start, stop;
  Clock::time_point t_start, t_stop;
  Status error = Status::ok();
  for (int i = 0; i < n; ++i) {
    GenerationCallbacks cb;
    auto first = std::make_shared<bool>(true);
    cb.on_token = [&, first](const TokenEvent&) {
      const auto now = Clock::now();
      if (window_open && !window_closed) token_times.push_back(now);
      if (*first && ++firsts == n) {  // every sequence decodes from the next step on
        window_open = true;
        start = engine->stats();
        t_start = now;
      }
      *first = false;
    };
    cb.on_finish = [&](GenerationResult&& r) {
      if (r.reason == FinishReason::kError) error = r.error;
      ttft.push_back(r.ttft_seconds);
      if (window_open && !window_closed) {
        window_closed = true;
        stop = engine->stats();
        t_stop = Clock::now();
      }
    };
    const auto prompt =
        bench_prompt(prompt_len, model->info().vocab_size, static_cast<uint64_t>(i));
    ATTNRES_RETURN_IF_ERROR(engine->submit(bench_request(prompt, gen), std::move(cb)).status());
  }
  ATTNRES_RETURN_IF_ERROR(engine->run());
  ATTNRES_RETURN_IF_ERROR(error);
  ConcurrentRun r;
  r.n = n;
  const double secs = std::chrono::duration<double>(t_stop - t_start).count();
  const int64_t steps = stop.steps - start.steps;
  if (!window_closed || steps <= 0 || secs <= 0)
    return Status(ErrorCode::kInvalidArgument,
                  "bench: --gen-tokens is too short for all sequences to decode together");
  r.aggregate_tps = static_cast<double>(token_times.size()) / secs;
  r.per_seq_tps = r.aggregate_tps / n;
  r.ttft_s = median(ttft);
  r.dense_bytes_per_step = (stop.dense_bytes - start.dense_bytes) / steps;
  r.mxfp4_bytes_per_step = (stop.mxfp4_bytes - start.mxfp4_bytes) / steps;
  r.bytes_per_step = r.dense_bytes_per_step + r.mxfp4_bytes_per_step +
                     n * (decode_attention_weight_bytes_per_sequence(*model) +
                          decode_state_bytes_per_token(*model, prompt_len + gen / 2, cache_elem));
  r.roofline_fraction =
      static_cast<double>(r.bytes_per_step) * static_cast<double>(steps) / secs / 1e9 / probe_gb_s;
  const double ds = stop.dense_seconds - start.dense_seconds;
  const double qs = stop.mxfp4_seconds - start.mxfp4_seconds;
  r.dense_share = ds / secs;
  r.mxfp4_share = qs / secs;
  r.dense_gb_s = ds > 0 ? static_cast<double>(stop.dense_bytes - start.dense_bytes) / ds / 1e9 : 0;
  r.mxfp4_gb_s = qs > 0 ? static_cast<double>(stop.mxfp4_bytes - start.mxfp4_bytes) / qs / 1e9 : 0;
  r.dense_gflop_s = ds > 0 ? (stop.dense_flops - start.dense_flops) / ds / 1e9 : 0;
  r.mxfp4_gflop_s = qs > 0 ? (stop.mxfp4_flops - start.mxfp4_flops) / qs / 1e9 : 0;
  return r;
}

Result<std::vector<int>> parse_concurrency(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 256)
      return Status(ErrorCode::kInvalidArgument,
                    "--concurrency: '" + item + "' is not a sequence count in 1..256");
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) return Status(ErrorCode::kInvalidArgument, "--concurrency: no counts given");
  return out;
}

int run_concurrent(const BenchArgs& a, std::shared_ptr<const Model> model, const EngineOptions& eo,
                   const MemoryBandwidth& stream, const ComputePeak& peak) {
  auto counts = parse_concurrency(a.concurrency);
  if (!counts) return fail(counts.status().to_string());
  const int64_t gen = a.gen_tokens > 0 ? a.gen_tokens : 128;
  const int64_t cache_elem = a.model.dtype == "f32" ? 4 : 2;
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json)
    std::printf("%4s %14s %14s %9s %16s %16s %9s  %s\n", "N", "aggregate tok/s", "per-seq tok/s",
                "TTFT s", "dense MB/step", "MXFP4 MB/step", "roofline",
                "time in dense / MXFP4 projections (GB/s, GFLOP/s)");
  for (int n : *counts) {
    auto r = concurrent_run(model, eo, n, a.prompt_tokens, gen, cache_elem, stream.read_gb_s);
    if (!r) return fail(r.status().to_string());
    rows.push_back({{"n", n},
                    {"aggregate_decode_tok_s", r->aggregate_tps},
                    {"per_seq_decode_tok_s", r->per_seq_tps},
                    {"ttft_s", r->ttft_s},
                    {"bytes_per_step", r->bytes_per_step},
                    {"dense_bytes_per_step", r->dense_bytes_per_step},
                    {"mxfp4_bytes_per_step", r->mxfp4_bytes_per_step},
                    {"roofline_fraction", r->roofline_fraction},
                    {"dense_proj_share", r->dense_share},
                    {"dense_proj_gb_s", r->dense_gb_s},
                    {"mxfp4_proj_share", r->mxfp4_share},
                    {"mxfp4_proj_gb_s", r->mxfp4_gb_s},
                    {"dense_proj_gflop_s", r->dense_gflop_s},
                    {"mxfp4_proj_gflop_s", r->mxfp4_gflop_s}});
    if (!a.json)
      std::printf(
          "%4d %15.2f %14.2f %9.3f %16.1f %16.1f %8.1f%%  %.0f%% (%.1f, %.0f) / %.0f%% (%.1f, "
          "%.0f)\n",
          n, r->aggregate_tps, r->per_seq_tps, r->ttft_s,
          static_cast<double>(r->dense_bytes_per_step) / 1e6,
          static_cast<double>(r->mxfp4_bytes_per_step) / 1e6, 100.0 * r->roofline_fraction,
          100.0 * r->dense_share, r->dense_gb_s, r->dense_gflop_s, 100.0 * r->mxfp4_share,
          r->mxfp4_gb_s, r->mxfp4_gflop_s);
  }
  if (a.json) {
    std::cout << nlohmann::json{{"model", a.model.model},
                                {"dtype", a.model.dtype},
                                {"threads", thread_count()},
                                {"ranks", model->info().ranks},
                                {"prompt_tokens", a.prompt_tokens},
                                {"gen_tokens", gen},
                                {"stream_gb_s", stream.read_gb_s},
                                {"peak_gflops", peak.gflop_s},
                                {"peak_instruction", peak.instruction},
                                {"concurrency", rows},
                                {"peak_rss_bytes", peak_rss_bytes()}}
                     .dump(2)
              << "\n";
  } else {
    std::printf(
        "STREAM read %.2f GB/s, %s peak %.1f GFLOP/s, %d threads, %lld prompt + %lld generated "
        "tokens each\n",
        stream.read_gb_s, peak.instruction.c_str(), peak.gflop_s, thread_count(),
        static_cast<long long>(a.prompt_tokens), static_cast<long long>(gen));
  }
  return 0;
}

int run_bench(const BenchArgs& a) {
  if (a.prompt_tokens < 1 || a.gen_tokens < 0 || a.reps < 1)
    return fail("bench: --prompt-tokens and --reps must be >= 1, --gen-tokens >= 1");
  if (a.prompt_tokens + a.gen_tokens > 1 << 24) return fail("bench: context too long");
  auto eo = engine_options(a.model);
  if (!eo) return fail("bench: " + eo.status().message());
  const auto t_load = Clock::now();
  auto model = load_cli_model(a.model, /*need_tokenizer=*/false, /*progress=*/false);
  if (!model) return fail(model.status().to_string());
  const double load_s = std::chrono::duration<double>(Clock::now() - t_load).count();
  auto stream = measure_memory_bandwidth();
  if (!stream) return fail(stream.status().to_string());
  const ComputePeak peak = measure_compute_peak(eo->activation == ActivationType::kBF16);
  reset_peak_rss();  // the probe's arrays are freed; the peak from here on is the model's
  // Without --concurrency each repetition's engine runs its own warm-up request first
  // (single_run); the first of them is also the first pass over the weights.
  if (a.concurrency.empty()) return run_single(a, *model, *eo, *stream, peak, load_s);
  {
    // Untimed warm-up at the workload's prompt length: the first pass over the memory-mapped
    // weights faults in their pages, of every expert the prompt routes to (a short prompt
    // leaves most experts to fault in during the first timed prefill).
    auto warm = single_run(*model, *eo,
                           bench_prompt(a.prompt_tokens, (*model)->info().vocab_size, 99), 4, 0.0);
    if (!warm) return fail(warm.status().to_string());
  }
  return run_concurrent(a, *model, *eo, *stream, peak);
}

const CommandRegistration kReg(
    "bench", "Prefill/decode speed against the machine's measured bandwidth", [](CLI::App* sub) {
      auto a = std::make_shared<BenchArgs>();
      add_model_options(sub, a->model);
      sub->add_option("--prompt-tokens", a->prompt_tokens, "Prompt length (default 256)");
      sub->add_option("--gen-tokens", a->gen_tokens,
                      "Generated tokens (default 512; 128 with --concurrency)");
      sub->add_option("--reps", a->reps, "Repetitions; median reported (default 3)");
      sub->add_option("--concurrency", a->concurrency,
                      "Sequence counts to run together, e.g. 1,2,4,8,16");
      sub->add_flag("--json", a->json, "Machine-readable output");
      return CommandRun([a] { return run_bench(*a); });
    });

}  // namespace
}  // namespace attnres::cli
