#include "model/forward.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/norm.h"
#include "kernels/parallel.h"
#include "model/blocks.h"

namespace attnres {

void ModelSublayers::attention(int layer, const float* in, float* out) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[static_cast<size_t>(layer)];
  if (lw.kda) {
    kda_block(c, *lw.kda, in, T_, state_.kda[static_cast<size_t>(layer)], opt_, arena_, out);
  } else {
    mla_block(c, *lw.mla, in, T_, state_.mla[static_cast<size_t>(layer)], opt_, arena_, out);
  }
}

void ModelSublayers::mlp(int layer, const float* in, float* out) {
  const ModelConfig& c = w_.config;
  const LayerWeights& lw = w_.layers[static_cast<size_t>(layer)];
  if (lw.moe) {
    moe_block(c, *lw.moe, in, T_, opt_, arena_, out);
  } else {
    dense_mlp_block(c, *lw.dense, in, T_, opt_, arena_, out);
  }
}

void model_attnres_read(const float* const* sources, int S, const float* q, int64_t T, int64_t d,
                        float eps, bool bf16_out, float* out) {
#pragma omp parallel for schedule(static) if (T * d * S > kParallelMinWork)
  for (int64_t t = 0; t < T; ++t) {
    float p[kMaxReadSources];
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
}

Status embed_tokens(const ModelWeights& w, const int32_t* tokens, int64_t T, float* out) {
  const int64_t d = w.config.hidden_size, V = w.config.vocab_size;
  for (int64_t t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= V)
      return Status(ErrorCode::kInvalidArgument, "token id " + std::to_string(tokens[t]) +
                                                     " at step position " + std::to_string(t) +
                                                     " is outside the vocabulary [0, " +
                                                     std::to_string(V) + ")");
  }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < d; ++i) out[t * d + i] = w.embed.get_f32(tokens[t] * d + i);
  return Status::ok();
}

void lm_head_logits(const ModelWeights& w, const ForwardOptions& opt, const float* xn, int64_t rows,
                    Arena& arena, float* logits) {
  // The bf16 model's lm_head output is bf16 too; logits are reported as f32 values of it.
  linear(opt, arena, xn, rows, w.lm_head, logits);
}

void final_logits(const ModelWeights& w, const ForwardOptions& opt, Arena& arena, const float* h,
                  int64_t rows, float* logits, const CaptureFn* capture) {
  const ModelConfig& c = w.config;
  float* xn = arena.take<float>(rows * c.hidden_size);  // [rows, d]
  rms_norm(h, rows, c.hidden_size, w.final_norm, c.rms_norm_eps, opt.bf16(), xn);
  if (capture) (*capture)("final_norm", xn, rows, c.hidden_size);
  lm_head_logits(w, opt, xn, rows, arena, logits);
  if (capture) (*capture)("logits", logits, rows, c.vocab_size);
}

namespace {

void add_into(float* acc, const float* x, int64_t n, bool bf16) {
  for (int64_t i = 0; i < n; ++i) acc[i] = bf16 ? round_bf16(acc[i] + x[i]) : acc[i] + x[i];
}

bool commits_at(const LayerSchedule& s, const Misreadings& mis, int i) {
  const int B = s.block_size;
  return mis.block_in_sublayers ? (2 * i) % B == 0 : i % B == 0;
}

}  // namespace

Status reference_forward(const ModelWeights& w, SequenceState& state, const ForwardOptions& opt,
                         Arena& arena, const int32_t* tokens, int64_t T, bool all_logits,
                         float* logits, const CaptureFn* capture) {
  const ModelConfig& c = w.config;
  const LayerSchedule& s = c.schedule;
  const int64_t d = c.hidden_size, n = T * d;
  const bool bf16 = opt.bf16();
  const float eps = c.rms_norm_eps;
  auto cap = [&](const std::string& name, const float* data) {
    if (capture) (*capture)(name, data, T, d);
  };

  float* running = arena.take<float>(n);  // [T, d] running sum of the current block
  ATTNRES_RETURN_IF_ERROR(embed_tokens(w, tokens, T, running));
  cap("embed", running);
  ModelSublayers sub(w, state, opt, arena, T);
  float* h = arena.take<float>(n);   // [T, d] the current sublayer input (mixture)
  float* xn = arena.take<float>(n);  // [T, d] its normalised form
  float* a = arena.take<float>(n);   // [T, d] the current sublayer output
  auto attention = [&](int i, const float* in) {
    rms_norm(in, T, d, w.layers[static_cast<size_t>(i)].input_norm, eps, bf16, xn);
    sub.attention(i, xn, a);
  };
  auto mlp = [&](int i, const float* in) {
    rms_norm(in, T, d, w.layers[static_cast<size_t>(i)].post_attn_norm, eps, bf16, xn);
    sub.mlp(i, xn, a);
  };

  if (!s.has_attnres()) {
    // Plain residual (Kimi-Linear): h = h + attn(norm(h)); h = h + mlp(norm(h)).
    for (int i = 0; i < s.num_layers(); ++i) {
      attention(i, running);
      add_into(running, a, n, bf16);
      mlp(i, running);
      add_into(running, a, n, bf16);
    }
  } else {
    int max_slots = 0;
    for (int i = 0; i < s.num_layers(); ++i) max_slots += commits_at(s, opt.mis, i) ? 1 : 0;
    if (max_slots + 1 > kMaxReadSources) {
      return Status(ErrorCode::kUnsupported,
                    c.source + ": AttnRes reads would see " + std::to_string(max_slots + 1) +
                        " sources (bank slots + running sum), at most " +
                        std::to_string(kMaxReadSources) + " are supported");
    }
    std::vector<float*> bank;  // committed slots, each [T, d]
    std::vector<const float*> srcs;
    bank.reserve(static_cast<size_t>(max_slots));
    float* bank_storage = arena.take<float>(static_cast<int64_t>(max_slots) * n);
    auto read = [&](const std::vector<float>& q, bool with_running, float* out) {
      srcs.assign(bank.begin(), bank.end());
      if (with_running) srcs.push_back(running);
      model_attnres_read(srcs.data(), static_cast<int>(srcs.size()), q.data(), T, d, eps, bf16,
                         out);
    };
    bool running_empty = false;  // true right after a commit, until the attention output lands
    for (int i = 0; i < s.num_layers(); ++i) {
      const LayerWeights& lw = w.layers[static_cast<size_t>(i)];
      const std::string L = "layer" + std::to_string(i) + ".";
      if (!bank.empty()) {
        read(lw.attn_res_query, true, h);
      } else {
        std::memcpy(h, running, sizeof(float) * static_cast<size_t>(n));
      }
      cap(L + "attn_in_mix", h);
      if (commits_at(s, opt.mis, i)) {
        float* slot = bank_storage + static_cast<int64_t>(bank.size()) * n;
        std::memcpy(slot, opt.mis.commit_mixture ? h : running,
                    sizeof(float) * static_cast<size_t>(n));
        bank.push_back(slot);
        running_empty = true;
      }
      attention(i, h);
      cap(L + "attn_out", a);
      if (running_empty) {
        std::memcpy(running, a, sizeof(float) * static_cast<size_t>(n));
        running_empty = false;
      } else {
        add_into(running, a, n, bf16);
      }
      read(lw.mlp_res_query, true, h);
      cap(L + "mlp_in_mix", h);
      mlp(i, h);
      cap(L + "mlp_out", a);
      add_into(running, a, n, bf16);
      cap(L + "running_sum", running);
      if (capture)
        for (size_t k = 0; k < bank.size(); ++k) cap(L + "bank." + std::to_string(k), bank[k]);
    }
    if (!opt.mis.skip_final_read) {
      read(w.out_res_query, true, h);
      std::memcpy(running, h, sizeof(float) * static_cast<size_t>(n));
    }
    cap("final_mix", running);
  }
  state.position += T;
  const int64_t rows = all_logits ? T : 1;
  final_logits(w, opt, arena, running + (T - rows) * d, rows, logits, capture);
  return Status::ok();
}

}  // namespace attnres
