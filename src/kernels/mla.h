// Multi-head latent attention (NoPE, gated) numerics over a latent context.
//
// The context of N tokens is stored as latents: c_kv [N, r] (after kv_a_layernorm) and the
// shared, unrotated k_rot [N, R]. Queries are [T, H, n + R] (q_nope | q_rot) for the T newest
// positions P..P+T-1 of the context (P = N - T); query t attends context tokens 0..P+t.
// Scores are softmax((q_nope . k_nope + q_rot . k_rot) * scale) in f32, no rotary anywhere.
//
// Two forms of the same function:
// - expanded (prefill, the HF form): k_nope | v per head from kv_b_proj, kv [N, H, n + dv];
// - absorbed (decode): q_lat = W_UK^T q_nope, score = q_lat . c_kv + q_rot . k_rot,
//   o = W_UV (sum_j p_j c_kv_j), with W_UK / W_UV the rows of kv_b_proj [H*(n+dv), r]. The
//   fast kernels read W_UK and W_UV as per-head projection weights made at load
//   (MlaAbsorbedWeights); the scalar twins read kv_b_proj itself.
//
// Contract: no allocation; scratch sizes given by the *_scratch_floats functions; each
// (token, head) output is computed by one thread in a fixed order.
#pragma once

#include <cstdint>

#include "kernels/matmul.h"
#include "util/tensor.h"

namespace attnres {

struct MlaDims {
  int64_t H = 0;       // heads
  int64_t nope = 0;    // qk_nope_head_dim
  int64_t rope = 0;    // qk_rope_head_dim (used unrotated)
  int64_t v = 0;       // v_head_dim
  int64_t r = 0;       // kv_lora_rank
  float scale = 0.0f;  // 1 / sqrt(nope + rope)
};

// mla_attend_* are the dispatched SIMD kernels (mla_hwy.cpp), mla_attend_*_ref the scalar
// twins that define the numerics (mla.cpp); same signatures and scratch, equal up to f32
// rounding (tests/unit/kernels/test_kda_mla.cpp).
int64_t mla_expanded_scratch_floats(int64_t N, int64_t T);
void mla_attend_expanded(const MlaDims& d, const float* q, int64_t T, const float* kv,
                         const float* k_rot, int64_t N, float* o, float* scratch);
void mla_attend_expanded_ref(const MlaDims& d, const float* q, int64_t T, const float* kv,
                             const float* k_rot, int64_t N, float* o, float* scratch);

// The absorbed form's weights (io/weights.h, MlaWeights): kv_b_proj [H*(n+dv), r] as stored
// (row h*(n+dv) + i is W_UK[h]'s row i for i < n, W_UV[h]'s row i - n after), which the scalar
// twins read, and per head W_UK[h]^T [r, n] and W_UV[h] [dv, r] as projection weights of
// matmul_batch (lane-packed where BF16), which the fast kernels read: q_lat = W_UK[h]^T q_nope
// and o = W_UV[h] o_lat are then each one projection job per head that streams its weights
// group by group, as the model's dense projections do.
struct MlaAbsorbedWeights {
  const TensorView* kv_b_proj = nullptr;
  const TensorView* uk_t = nullptr;  // [H]
  const TensorView* uv = nullptr;    // [H]
};

// Rows [0, rows) of a [rows, width] matrix stored in pages of `page_rows` rows: row i lives at
// pages[i / page_rows] + (i % page_rows) * width (a paged latent cache, model/kv_cache.h). A
// contiguous matrix is one page of `rows` rows.
template <typename T>
struct PagedRows {
  const T* const* pages = nullptr;
  int64_t page_rows = 0;
  int64_t width = 0;
  int64_t rows = 0;
  int64_t num_pages() const { return page_rows > 0 ? (rows + page_rows - 1) / page_rows : 0; }
};

// Scratch of the absorbed form over a context of N rows in pages of page_rows rows (0: one
// contiguous page).
int64_t mla_absorbed_scratch_floats(const MlaDims& d, int64_t N, int64_t T, int64_t page_rows = 0);
// The absorbed form's scratch (mla_absorbed_scratch_floats floats), carved the same way by the
// fast kernel and its twin.
struct MlaAbsorbedScratch {
  MatmulJob* jobs;  // [H + 2 * pages + 2]
  float* q_lat;     // [H, r]
  float* q_rot;     // [H, rope]
  float* s_lat;     // [H, N] latent part of the scores
  float* s_rot;     // [H, N] rope part of the scores
  float* o_lat;     // [H, r]
};
MlaAbsorbedScratch mla_absorbed_scratch(const MlaDims& d, int64_t N, float* scratch,
                                        int64_t page_rows = 0);
void mla_attend_absorbed(const MlaDims& d, const float* q, int64_t T, const float* c_kv,
                         const float* k_rot, int64_t N, const MlaAbsorbedWeights& w, float* o,
                         float* scratch);
void mla_attend_absorbed_ref(const MlaDims& d, const float* q, int64_t T, const float* c_kv,
                             const float* k_rot, int64_t N, const MlaAbsorbedWeights& w, float* o,
                             float* scratch);
// The absorbed form over a bf16 context as a bf16 latent cache holds it (c_kv [N, r] and
// k_rot [N, R], each contiguous), read in place: bitwise the same as mla_attend_absorbed on the
// context widened to f32 (every product widens the bf16 value exactly, in the same order), so
// decode needs no dequantised copy of the whole context per layer and step.
void mla_attend_absorbed(const MlaDims& d, const float* q, int64_t T, const bf16* c_kv,
                         const bf16* k_rot, int64_t N, const MlaAbsorbedWeights& w, float* o,
                         float* scratch);
// The absorbed form over a paged context (c_kv.rows == k_rot.rows == N, the same page size),
// read in place: bitwise the same as over the context in one contiguous page (every score is
// one dot product wherever its row lies, and o_lat accumulates the rows in increasing index).
// scratch: mla_absorbed_scratch_floats(d, N, T, page_rows).
void mla_attend_absorbed(const MlaDims& d, const float* q, int64_t T, const PagedRows<float>& c_kv,
                         const PagedRows<float>& k_rot, const MlaAbsorbedWeights& w, float* o,
                         float* scratch);
void mla_attend_absorbed(const MlaDims& d, const float* q, int64_t T, const PagedRows<bf16>& c_kv,
                         const PagedRows<bf16>& k_rot, const MlaAbsorbedWeights& w, float* o,
                         float* scratch);

// The absorbed form for the decoding sequences of one step at once: one query token each (its
// newest position), each over its own whole context, sharing one pass over the weights (W_UK and
// W_UV are read once per step, not once per sequence). Every row's result is bitwise what
// mla_attend_absorbed gives it alone (the same products in the same order).
template <typename C>
struct AbsorbedRow {
  using value_type = C;
  const float* q = nullptr;  // [H, nope + rope]
  PagedRows<C> c_kv, k_rot;  // its context, [N, r] and [N, rope]
  float* o = nullptr;        // [H, v]
};
// Scratch of mla_attend_absorbed_rows for rows with these context lengths.
int64_t mla_absorbed_rows_scratch_floats(const MlaDims& d, const int64_t* contexts, int64_t rows,
                                         int64_t page_rows);
void mla_attend_absorbed_rows(const MlaDims& d, const AbsorbedRow<float>* rows, int64_t n,
                              const MlaAbsorbedWeights& w, float* scratch);
void mla_attend_absorbed_rows(const MlaDims& d, const AbsorbedRow<bf16>* rows, int64_t n,
                              const MlaAbsorbedWeights& w, float* scratch);

}  // namespace attnres
