// Kimi Delta Attention numerics: the short causal depthwise convolution with carried state, the
// per-channel forget gate, and the gated delta rule in two forms: the recurrent step (decode,
// and the reference) and the chunked WY/UT form (prefill). References: fla
// fla/ops/kda/naive.py (naive_recurrent_kda, naive_chunk_kda) and fla/ops/kda/gate.py
// (naive_kda_lowerbound_gate, naive_kda_gate).
//
// Layouts: tokens are rows. q, k, g are [T, H, dk]; v and o are [T, H, dv]; beta is [T, H];
// the recurrent state is [H, dk, dv] f32 (S[h][i][j]: key channel i, value channel j).
// q must already be L2-normalised and scaled by dk^-1/2, k L2-normalised; g is the log decay
// (alpha = exp(g) <= 1).
//
// Contract: no allocation (scratch is passed in); each head is processed by one thread with a
// fixed order, so results do not depend on the thread count. The recurrent and chunked forms
// compute the same function (kda unit tests bound their difference).
#pragma once

#include <cstdint>
#include <optional>

#include "util/limits.h"

namespace attnres {

// Causal depthwise conv + SiLU over C channels: y[t,c] = silu(sum_j w[c,j] * x[t-W+1+j, c]),
// where inputs before the first token come from `state` [C, W-1] (oldest first; zeros at the
// start of a sequence). On return `state` holds the last W-1 inputs. weight is [C, W]. y may
// alias x. W must be <= kMaxConvWidth (util/limits.h; config validation enforces it).
void causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* weight, int W,
                        float* state, float* y);
// Whether causal_conv1d_silu over T tokens of C channels splits its channels over the threads
// (else it runs on the calling thread).
bool causal_conv1d_silu_splits(int64_t T, int64_t C, int W);

// Forget gate per channel. f is W_fb W_fa x [T, H*dk], a_log [H] (per head), dt_bias [H*dk].
// With a lower bound lb: g = lb * sigmoid(exp(a_log[h]) * (f + dt_bias)).
// Without: g = -exp(a_log[h]) * softplus(f + dt_bias). g may alias f.
void kda_gate(const float* f, int64_t T, int64_t H, int64_t dk, const float* a_log,
              const float* dt_bias, std::optional<float> lower_bound, float* g);

// Recurrent gated delta rule, token by token (the definition):
//   S = diag(exp(g_t)) S;  S += beta_t k_t (v_t - S^T k_t)^T;  o_t = S^T q_t.
// kda_recurrent is the dispatched SIMD kernel (kda_hwy.cpp: two passes over S per head and
// token), kda_recurrent_ref the scalar twin that defines the numerics; they agree up to f32
// rounding (tests/unit/kernels/test_kda_mla.cpp).
void kda_recurrent(const float* q, const float* k, const float* v, const float* g,
                   const float* beta, int64_t T, int64_t H, int64_t dk, int64_t dv, float* state,
                   float* o);
void kda_recurrent_ref(const float* q, const float* k, const float* v, const float* g,
                       const float* beta, int64_t T, int64_t H, int64_t dk, int64_t dv,
                       float* state, float* o);

// Chunked (WY / UT transform) form with chunks of `chunk` tokens (the last may be shorter).
// Same function as kda_recurrent up to f32 rounding. Only decay ratios exp(gc_i - gc_j) with
// gc_i <= gc_j are formed, so nothing overflows for any chunk length.
// scratch must hold kda_chunk_scratch_floats(H, chunk, dk, dv) floats.
int64_t kda_chunk_scratch_floats(int64_t H, int64_t chunk, int64_t dk, int64_t dv);
// kda_chunked is the dispatched SIMD kernel (kda_hwy.cpp, same algorithm and scratch),
// kda_chunked_ref the scalar twin.
void kda_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                 int64_t T, int64_t H, int64_t dk, int64_t dv, int64_t chunk, float* state,
                 float* o, float* scratch);
void kda_chunked_ref(const float* q, const float* k, const float* v, const float* g,
                     const float* beta, int64_t T, int64_t H, int64_t dk, int64_t dv, int64_t chunk,
                     float* state, float* o, float* scratch);

// Pieces both chunked forms share (kda.cpp). Decay ratios exp(gc_c - gc_i) are factored through
// the start s of c's sub-block of kKdaSubBlock steps: exp(gc_c - gc_s) * exp(gc_s - gc_i).
// Within a sub-block both factors stay inside exp(+-kKdaMaxFactorLog); for i before the
// sub-block both are <= 1. A sub-block whose decay span exceeds kKdaMaxFactorLog (possible only
// without a gate lower bound) uses exact pairwise exponentials instead, so nothing overflows for
// any gate values. The scratch holds kda_sub_blocks(chunk) sub-blocks per head.
inline constexpr int64_t kKdaSubBlock = 16;
inline constexpr float kKdaMaxFactorLog = 80.0f;  // exp(80) ~ 5.5e34 < FLT_MAX; exp(-80) normal
inline int64_t kda_sub_blocks(int64_t chunk) {
  return (chunk + kKdaSubBlock - 1) / kKdaSubBlock;
}
// gc [L, dk]: gc_c = gc_{c-1} + g_{t0+c} (head h of g [T, H, dk]), summed in double.
// Why double: every exponent of the chunked form is a difference of two cumulative sums
// (gc_c - gc_i), where the recurrent form multiplies per-step factors exp(g_t). An f32
// cumulative sum carries an absolute error of order 2^-24 |gc|, and on a 64-token chunk of gates
// near the lower bound |gc| reaches 320: every ratio of nearby steps was off by ~1e-5 relative,
// and chunked prefill 4-5x noisier than recurrent in the logits of a 93-layer model.
void kda_cumulative_gates(const float* g, int64_t t0, int64_t L, int64_t H, int64_t h, int64_t dk,
                          double* gc);
// An exponent x[d] - y[d] (y null: x[d]) of the double cumulative gates as an unevaluated f32
// sum hi + lo: hi = float(x - y), lo = float((x - y) - hi). exp(hi) * (1 + lo) is exp(x - y) to
// within the exponential's own rounding whatever |x - y|; hi alone would carry an absolute error
// up to 2^-25 |x - y|, and the factored ratios exp(gc_c - gc_s) * exp(gc_s - gc_i) multiply two
// factors whose exponents reach +-80 within a sub-block (lower bound -5 over 16 steps) for a
// ratio near 1, so that error, 80 times the recurrent form's per-step rounding, would dominate.
void kda_gate_split(const double* x, const double* y, int64_t n, float* hi, float* lo);
// Whether sub-block [s0, s1) of gc [., dk] may use the factored form: its largest decay
// max_d (gc_s0 - gc_{s1-1}) is at most kKdaMaxFactorLog.
bool kda_sub_block_factored(const double* gc, int64_t s0, int64_t s1, int64_t dk);

}  // namespace attnres
