#include "model/reference.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/norm.h"
#include "kernels/parallel.h"
#include "util/parallel.h"

namespace attnres {

void model_attnres_read(const float* const* sources, int S, const float* q, int64_t T, int64_t d,
                        float eps, bool bf16_out, float* out) {
  parallel_ranges(T, T * d * S > kParallelMinWork, [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      float p[kMaxReadSources] = {};
      float mx = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < S; ++j) {
        const float* v = sources[j] + t * d;
        float dot = 0.0f, ss = 0.0f;
        for (int64_t i = 0; i < d; ++i) {
          dot += v[i] * q[i];
          ss += v[i] * v[i];
        }
        p[j] = dot / std::sqrt(ss / static_cast<float>(d) + eps);
        mx = std::max(mx, p[j]);
      }
      float sum = 0.0f;
      for (int j = 0; j < S; ++j) {
        p[j] = std::exp(p[j] - mx);
        sum += p[j];
      }
      for (int j = 0; j < S; ++j) p[j] /= sum;
      float* o = out + t * d;
      for (int64_t i = 0; i < d; ++i) {
        float acc = 0.0f;
        for (int j = 0; j < S; ++j) acc += p[j] * sources[j][t * d + i];
        o[i] = bf16_out ? round_bf16(acc) : acc;
      }
    }
  });
}

namespace {

void final_logits(const ModelWeights& w, const ForwardOptions& opt, Arena& arena, const float* h,
                  int64_t rows, float* logits, const CaptureFn* capture) {
  const ModelConfig& c = w.config;
  float* xn = arena.take<float>(rows * c.hidden_size);  // [rows, d]
  rms_norm(h, rows, c.hidden_size, w.final_norm, c.rms_norm_eps, opt.bf16(), xn);
  if (capture) (*capture)("final_norm", xn, rows, c.hidden_size);
  lm_head_logits(w, opt, xn, rows, arena, logits);
  if (capture) (*capture)("logits", logits, rows, c.vocab_size);
}

void add_into(float* acc, const float* x, int64_t n, bool bf16) {
  for (int64_t i = 0; i < n; ++i) acc[i] = bf16 ? round_bf16(acc[i] + x[i]) : acc[i] + x[i];
}

bool commits_at(const LayerSchedule& s, const Misreadings& mis, int i) {
  const int B = s.block_size;
  return mis.block_in_sublayers ? (2 * i) % B == 0 : i % B == 0;
}

// The buffers and sublayers of one reference step over T rows of width d.
struct RefStep {
  const ModelWeights& w;
  ModelSublayers& sub;
  const CaptureFn* capture;
  int64_t T, d, n;
  bool bf16;
  float* running;  // [T, d] running sum of the current block
  float* h;        // [T, d] the current sublayer input (mixture)
  float* xn;       // [T, d] its normalised form
  float* a;        // [T, d] the current sublayer output

  void cap(const std::string& name, const float* data) const {
    if (capture) (*capture)(name, data, T, d);
  }
  void attention(int i, const float* in) {
    rms_norm(in, T, d, w.layers[static_cast<size_t>(i)].input_norm, w.config.rms_norm_eps, bf16,
             xn);
    sub.attention(i, xn, nullptr, a);
  }
  void mlp(int i, const float* in) {
    rms_norm(in, T, d, w.layers[static_cast<size_t>(i)].post_attn_norm, w.config.rms_norm_eps, bf16,
             xn);
    sub.mlp(i, xn, nullptr, a);
  }
  void copy(float* dst, const float* src) const {
    std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
  }
};

// Plain residual (Kimi-Linear): h = h + attn(norm(h)); h = h + mlp(norm(h)).
void plain_residual_layers(RefStep& r) {
  for (int i = 0; i < r.w.config.schedule.num_layers(); ++i) {
    r.attention(i, r.running);
    add_into(r.running, r.a, r.n, r.bf16);
    r.mlp(i, r.running);
    add_into(r.running, r.a, r.n, r.bf16);
  }
}

// Block AttnRes: every sublayer input is a read over the committed bank and the running sum;
// layer i with i % B == 0 first commits the running sum into a new bank slot and restarts it
// with its attention output; the final mixture is a read too. The result is in r.running.
void attnres_layers(RefStep& r, Arena& arena, const Misreadings& mis, int max_slots) {
  const ModelWeights& w = r.w;
  const LayerSchedule& s = w.config.schedule;
  std::vector<float*> bank;  // committed slots, each [T, d]
  std::vector<const float*> srcs;
  bank.reserve(static_cast<size_t>(max_slots));
  float* bank_storage = arena.take<float>(static_cast<int64_t>(max_slots) * r.n);
  auto read = [&](const std::vector<float>& q, float* out) {
    srcs.assign(bank.begin(), bank.end());
    srcs.push_back(r.running);
    model_attnres_read(srcs.data(), static_cast<int>(srcs.size()), q.data(), r.T, r.d,
                       w.config.rms_norm_eps, r.bf16, out);
  };
  for (int i = 0; i < s.num_layers(); ++i) {
    const LayerWeights& lw = w.layers[static_cast<size_t>(i)];
    const std::string L = "layer" + std::to_string(i) + ".";
    if (!bank.empty())
      read(lw.attn_res_query, r.h);
    else
      r.copy(r.h, r.running);  // layer 0: HF skips the read of the embedding alone
    r.cap(L + "attn_in_mix", r.h);
    const bool commit = commits_at(s, mis, i);
    if (commit) {
      float* slot = bank_storage + static_cast<int64_t>(bank.size()) * r.n;
      r.copy(slot, mis.commit_mixture ? r.h : r.running);
      bank.push_back(slot);
    }
    r.attention(i, r.h);
    r.cap(L + "attn_out", r.a);
    if (commit)
      r.copy(r.running, r.a);  // the block restarts with the attention output
    else
      add_into(r.running, r.a, r.n, r.bf16);
    read(lw.mlp_res_query, r.h);
    r.cap(L + "mlp_in_mix", r.h);
    r.mlp(i, r.h);
    r.cap(L + "mlp_out", r.a);
    add_into(r.running, r.a, r.n, r.bf16);
    r.cap(L + "running_sum", r.running);
    if (r.capture)
      for (size_t k = 0; k < bank.size(); ++k) r.cap(L + "bank." + std::to_string(k), bank[k]);
  }
  if (!mis.skip_final_read) {
    read(w.out_res_query, r.h);
    r.copy(r.running, r.h);
  }
  r.cap("final_mix", r.running);
}

}  // namespace

Status reference_forward(const ModelWeights& w, SequenceState& state, const ForwardOptions& opt,
                         Arena& arena, const int32_t* tokens, int64_t T, bool all_logits,
                         float* logits, const CaptureFn* capture, const Misreadings& mis) {
  const ModelConfig& c = w.config;
  const LayerSchedule& s = c.schedule;
  int max_slots = 0;
  for (int i = 0; s.has_attnres() && i < s.num_layers(); ++i)
    max_slots += commits_at(s, mis, i) ? 1 : 0;
  if (max_slots + 1 > kMaxReadSources) {
    return Status(ErrorCode::kUnsupported, c.source + ": AttnRes reads would see " +
                                               std::to_string(max_slots + 1) +
                                               " sources (bank slots + running sum), at most " +
                                               std::to_string(kMaxReadSources) + " are supported");
  }
  const Segment seg{&state, 0, T};
  ATTNRES_RETURN_IF_ERROR(reserve_segments(Segments(&seg, 1)));
  const int64_t d = c.hidden_size, n = T * d;
  float* running = arena.take<float>(n);
  ATTNRES_RETURN_IF_ERROR(embed_tokens(w, tokens, T, running));
  ModelSublayers sub(w, Segments(&seg, 1), opt, arena, T);
  RefStep r{w,
            sub,
            capture,
            T,
            d,
            n,
            opt.bf16(),
            running,
            arena.take<float>(n),
            arena.take<float>(n),
            arena.take<float>(n)};
  r.cap("embed", running);
  if (s.has_attnres())
    attnres_layers(r, arena, mis, max_slots);
  else
    plain_residual_layers(r);
  advance_segments(Segments(&seg, 1));
  const int64_t rows = all_logits ? T : 1;
  final_logits(w, opt, arena, running + (T - rows) * d, rows, logits, capture);
  return Status::ok();
}

}  // namespace attnres
