#include "kernels/mla.h"
#include "kernels/parallel.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/matmul.h"
#include "util/numeric.h"
#include "util/parallel.h"

namespace attnres {
namespace {

// p[0..n) = softmax(s[0..n)) in place (f32, max-subtracted).
void softmax_inplace(float* s, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - mx);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}

// y[0..n) += a * w[0..n) with w widened exactly; contiguous, so the loop vectorises.
template <typename W>
void axpy_w(float a, const W* __restrict w, float* __restrict y, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    if constexpr (std::is_same_v<W, bf16>) {
      y[c] += a * bf16_to_f32(w[c]);
    } else {
      y[c] += a * w[c];
    }
  }
}

// sum_i a[i] b[i] in 8 interleaved partial sums (lane l takes i = l, l + 8, ...), added
// pairwise at the end: a fixed order that the compiler can keep in vector registers.
float dot_lanes(const float* __restrict a, const float* __restrict b, int64_t n) {
  constexpr int kL = 8;
  float acc[kL] = {};
  int64_t i = 0;
  for (; i + kL <= n; i += kL)
    for (int l = 0; l < kL; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i + l < n; ++l) acc[l] += a[i + l] * b[i + l];
  for (int w = kL / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

}  // namespace

int64_t mla_expanded_scratch_floats(int64_t N, int64_t T) {
  return T * N;  // [T, N]: one score row per query token, reused across heads
}

void mla_attend_expanded_ref(const MlaDims& d, const float* q, int64_t T, const float* kv,
                             const float* k_rot, int64_t N, float* o, float* scratch) {
  const int64_t P = N - T, qw = d.nope + d.rope, kvw = d.nope + d.v;
  parallel_ranges(
      T, T * N * d.H * (d.nope + d.v) > kParallelMinWork, [&](int64_t t_begin, int64_t t_end) {
        for (int64_t t = t_begin; t < t_end; ++t) {
          float* s = scratch + t * N;  // [N] scores of token t (reused across heads)
          const int64_t n_ctx = P + t + 1;
          for (int64_t h = 0; h < d.H; ++h) {
            const float* qt = q + (t * d.H + h) * qw;
            for (int64_t j = 0; j < n_ctx; ++j) {
              const float* kj = kv + (j * d.H + h) * kvw;
              const float* kr = k_rot + j * d.rope;
              s[j] = (dot_lanes(qt, kj, d.nope) + dot_lanes(qt + d.nope, kr, d.rope)) * d.scale;
            }
            softmax_inplace(s, n_ctx);
            // o = sum_j p_j v_j, row by row (each ot[e] sums its terms in increasing j).
            float* ot = o + (t * d.H + h) * d.v;
            for (int64_t e = 0; e < d.v; ++e) ot[e] = 0.0f;
            for (int64_t j = 0; j < n_ctx; ++j)
              axpy_w(s[j], kv + (j * d.H + h) * kvw + d.nope, ot, d.v);
          }
        }
      });
}

namespace {
// Floats holding the [H + 2 * pages + 2] MatmulJob array at the start of the absorbed scratch
// (W_UV jobs per head; score jobs per context page for c_kv and k_rot).
int64_t absorbed_job_floats(const MlaDims& d, int64_t N, int64_t page_rows) {
  const int64_t pages = page_rows > 0 ? (N + page_rows - 1) / page_rows : 1;
  return (d.H + 2 * pages + 2) *
         static_cast<int64_t>((sizeof(MatmulJob) + sizeof(float) - 1) / sizeof(float));
}
}  // namespace

int64_t mla_absorbed_scratch_floats(const MlaDims& d, int64_t N, int64_t T, int64_t page_rows) {
  (void)T;  // one token at a time: the scratch is reused
  return absorbed_job_floats(d, N, page_rows) + d.H * (2 * d.r + d.rope + 2 * N);
}

MlaAbsorbedScratch mla_absorbed_scratch(const MlaDims& d, int64_t N, float* scratch,
                                        int64_t page_rows) {
  MlaAbsorbedScratch s;
  s.jobs = reinterpret_cast<MatmulJob*>(scratch);
  s.q_lat = scratch + absorbed_job_floats(d, N, page_rows);
  s.q_rot = s.q_lat + d.H * d.r;
  s.s_lat = s.q_rot + d.H * d.rope;
  s.s_rot = s.s_lat + d.H * N;
  s.o_lat = s.s_rot + d.H * N;
  return s;
}

void mla_attend_absorbed_ref(const MlaDims& d, const float* q, int64_t T, const float* c_kv,
                             const float* k_rot, int64_t N, const MlaAbsorbedWeights& w, float* o,
                             float* scratch) {
  const TensorView& kv_b_proj = *w.kv_b_proj;
  const int64_t P = N - T, qw = d.nope + d.rope, kvw = d.nope + d.v, H = d.H, r = d.r;
  const MlaAbsorbedScratch sc = mla_absorbed_scratch(d, N, scratch);
  MatmulJob* jobs = sc.jobs;
  float *q_lat = sc.q_lat, *q_rot = sc.q_rot, *s_lat = sc.s_lat, *s_rot = sc.s_rot;
  float* o_lat = sc.o_lat;
  const bool wbf16 = kv_b_proj.dtype == DType::kBF16;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n_ctx = P + t + 1;
    // q_lat[h] = W_UK[h]^T q_nope[h] (rows h*kvw + i of kv_b_proj, summed in increasing i).
    parallel_ranges(H, H * d.nope * r > kParallelMinWork, [&](int64_t h_begin, int64_t h_end) {
      for (int64_t h = h_begin; h < h_end; ++h) {
        const float* qt = q + (t * H + h) * qw;
        float* ql = q_lat + h * r;
        for (int64_t c = 0; c < r; ++c) ql[c] = 0.0f;
        for (int64_t i = 0; i < d.nope; ++i) {
          const int64_t wrow = (h * kvw + i) * r;
          if (wbf16)
            axpy_w(qt[i], kv_b_proj.as<bf16>() + wrow, ql, r);
          else
            axpy_w(qt[i], kv_b_proj.as<float>() + wrow, ql, r);
        }
        for (int64_t i = 0; i < d.rope; ++i) q_rot[h * d.rope + i] = qt[d.nope + i];
      }
    });
    // Scores of every head against the context: [H, r] x c_kv[n_ctx, r]^T and
    // [H, rope] x k_rot[n_ctx, rope]^T, one batch (c_kv / k_rot rows act as weight rows).
    jobs[0] = f32_job(q_lat, H, c_kv, n_ctx, r, s_lat);
    jobs[1] = f32_job(q_rot, H, k_rot, n_ctx, d.rope, s_rot);
    matmul_batch(jobs, d.rope > 0 ? 2 : 1);
    // Softmax and o_lat[h] = sum_j p_j c_kv_j (in increasing j), one head per thread.
    parallel_ranges(H, H * n_ctx * r > kParallelMinWork, [&](int64_t h_begin, int64_t h_end) {
      for (int64_t h = h_begin; h < h_end; ++h) {
        float* s = s_lat + h * n_ctx;  // the [H, n_ctx] rows of the batch output
        const float* sr = s_rot + h * n_ctx;
        for (int64_t j = 0; j < n_ctx; ++j) s[j] = (s[j] + (d.rope > 0 ? sr[j] : 0.0f)) * d.scale;
        softmax_inplace(s, n_ctx);
        float* ol = o_lat + h * r;
        for (int64_t c = 0; c < r; ++c) ol[c] = 0.0f;
        for (int64_t j = 0; j < n_ctx; ++j) axpy_w(s[j], c_kv + j * r, ol, r);
      }
    });
    // o[t, h] = W_UV[h] o_lat[h]: rows h*kvw + nope .. + v of kv_b_proj, all heads in one batch.
    for (int64_t h = 0; h < H; ++h)
      jobs[h] =
          dense_rows_job(o_lat + h * r, 1, kv_b_proj, h * kvw + d.nope, d.v, o + (t * H + h) * d.v);
    matmul_batch(jobs, H);
  }
}

}  // namespace attnres
