// Block Attention Residuals (AttnRes): the read over the residual bank, and the fused step that
// the executor runs at every read (k3-model.md §2; HF modeling_kimi_linear.py, the
// attention-residual read and KimiRMSNorm).
//
// Read, per token row, over sources v_0..v_{n-1} = bank[0..S-1] ++ [running_sum]:
//   score_j = dot(v_j, q) * rsqrt(mean(v_j^2) + eps)        fp32; q = res_norm.w * res_proj.w
//   p = softmax(score)                                       fp32, no 1/sqrt(d), no bias
//   mixture = T( sum_j p_j * v_j )                           raw values, summed in j order
// followed by the sublayer's RMSNorm (KimiRMSNorm):
//   out = T( T( mixture * rsqrt(mean(mixture^2) + eps) ) * gain )
// where T() is the storage cast: round to nearest even bf16 in bf16 mode, identity in f32 mode.
// With one source (layer 0's pre-attention read, every read of a plain-residual model) p = 1
// exactly and the mixture is the source itself: the read is skipped as in HF.
//
// The step (one pass per token row, in this order):
//   1. delayed add: rs' = T(rs_in + pending) (when both exist; else rs' = whichever exists)
//   2. commit (optional): bank slot = rs', and its inverse RMS rsqrt(mean(rs'^2) + eps) is
//      stored per token row, so later reads never recompute it
//   3. scores over the committed slots (cached inverse RMS) and rs' (fresh), softmax, mix
//   4. RMSNorm with the gain, written to `out`
//
// Aliasing: every write of a row happens after every read of that row, and elementwise writes
// (rs_out, commit, out) at column j follow the reads of column j, so rs_out may alias rs_in or
// pending, commit may alias rs_out (then no copy is made) and out may alias pending, rs_in or
// any source (the verifier decides whether the overwritten value is still needed).
//
// Numerics: the fused step and the reference perform the same elementwise operations (the add,
// the casts, the mix as p_0*v_0 + p_1*v_1 + ... with separate multiply and add, the norm), so
// they differ only through the reduction order of the dot products and the sums of squares
// (fused: vector lanes and a fixed lane reduction; reference: sequential). The running sum and
// committed slots are therefore bitwise equal. Bound, per element: the mixture within 1 ulp of
// T and the normalised output within 3 ulp of T (the mixture's ulp and the norm's two casts),
// each plus 1e-4 x the row's RMS for the score differences; the commit's inverse RMS within
// 1e-5 relative. Measured worst excess over the ulp terms: 1.2e-6 (bf16), 2.2e-5 (f32) of the
// row RMS; tests/unit/plan/test_attnres_kernel.cpp gates it.
// Each row is computed by one thread with a fixed order, so results are bitwise identical for
// any thread count. Kernels never allocate.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "util/limits.h"
#include "util/numeric.h"

namespace attnres {

// Steps over fewer than this many elements (T x d) run on one thread: a parallel region costs more
// than the work. Which thread computes a row never changes its value.
inline constexpr int64_t kAttnResParallelMinElements = int64_t{1} << 18;

// At most kMaxAttnResSources (util/limits.h) sources per read: config validation and
// Executor::create refuse anything larger before a step runs.

template <typename T>  // T = bf16 or float: the storage element type
struct AttnResStepArgs {
  int64_t tokens = 0;  // T rows
  int64_t dim = 0;     // d
  float res_eps = 0;   // eps of the source RMS
  float norm_eps = 0;  // eps of the following RMSNorm

  int num_slots = 0;                           // committed slots read (S)
  const T* const* slots = nullptr;             // [S] pointers to [T, d]
  const float* const* slot_inv_rms = nullptr;  // [S] pointers to [T] (fused step only)

  const T* rs_in = nullptr;         // [T, d] running sum before the add, or null (block restart)
  const T* pending = nullptr;       // [T, d] sublayer output to fold in, or null
  T* rs_out = nullptr;              // [T, d] new running sum; required iff rs_in and pending
  T* commit = nullptr;              // [T, d] bank slot to commit rs' into, or null
  float* commit_inv_rms = nullptr;  // [T] required with commit

  const float* query = nullptr;        // [d] folded query; unused with one source
  const float* norm_weight = nullptr;  // [d] RMSNorm gain (widened to f32)
  T* out = nullptr;                    // [T, d] normalised mixture
  T* raw_mixture = nullptr;            // [T, d] optional: the mixture before the norm

  int num_sources() const { return num_slots + 1; }
};

// Fused step (Highway, dispatched once per process to the best compiled target).
void attnres_step(const AttnResStepArgs<bf16>& a);
void attnres_step(const AttnResStepArgs<float>& a);
// Scalar reference of the same step: recomputes every source's RMS at the read, sequential
// reductions. `slot_inv_rms` is ignored; `commit_inv_rms` is still filled.
void attnres_step_ref(const AttnResStepArgs<bf16>& a);
void attnres_step_ref(const AttnResStepArgs<float>& a);

// Scalar reference read alone (no add, commit or norm): out[t] = T(sum_j p_j v_j[t]).
void attnres_read_ref(const bf16* const* sources, int num_sources, int64_t tokens, int64_t dim,
                      const float* query, float eps, bf16* out);
void attnres_read_ref(const float* const* sources, int num_sources, int64_t tokens, int64_t dim,
                      const float* query, float eps, float* out);

// Softmax of n scores in place, fp32: p_j = exp(s_j - max) / sum_k exp(s_k - max), the sum
// taken in index order. Shared by the fused step and the reference so both see the same p.
inline void attnres_softmax(float* s, int n) {
  float m = s[0];
  for (int j = 1; j < n; ++j) m = s[j] > m ? s[j] : m;
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    sum += s[j];
  }
  for (int j = 0; j < n; ++j) s[j] = s[j] / sum;
}

// rsqrt(sumsq / d + eps) as the model defines it (mean then rsqrt, fp32).
inline float attnres_inv_rms(float sumsq, int64_t dim, float eps) {
  return 1.0f / std::sqrt(sumsq / static_cast<float>(dim) + eps);
}

// Name of the Highway target the fused step runs on ("AVX3", "AVX2", ...).
std::string attnres_target_name();

// Test hook: allows (the default) or forbids the AVX512_BF16 conversion instruction for the
// fused step's bf16 casts. Both give bitwise the same results (the tests compare them); this
// only exists so that they can. Returns whether the instruction is now used (allowed, the CPU
// has AVX512_BF16 and the dispatched target is AVX3). Not for use while a step runs.
bool attnres_set_hw_bf16_casts(bool enabled);

}  // namespace attnres
