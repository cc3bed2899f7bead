#include "kernels/mla.h"
#include "kernels/parallel.h"

#include <cmath>
#include <limits>

namespace attnres {
namespace {

float weight_at(const TensorView& w, int64_t i) {
  return w.dtype == DType::kBF16 ? bf16_to_f32(w.as<bf16>()[i]) : w.as<float>()[i];
}

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

}  // namespace

int64_t mla_expanded_scratch_floats(int64_t N, int64_t T) {
  return T * N;  // [T, N]: one score row per query token, reused across heads
}

void mla_attend_expanded(const MlaDims& d, const float* q, int64_t T, const float* kv,
                         const float* k_rot, int64_t N, float* o, float* scratch) {
  const int64_t P = N - T, qw = d.nope + d.rope, kvw = d.nope + d.v;
#pragma omp parallel for schedule(static) if (T * N * d.H * (d.nope + d.v) > kParallelMinWork)
  for (int64_t t = 0; t < T; ++t) {
    float* s = scratch + t * N;  // [N] scores of token t (reused across heads)
    const int64_t n_ctx = P + t + 1;
    for (int64_t h = 0; h < d.H; ++h) {
      const float* qt = q + (t * d.H + h) * qw;
      for (int64_t j = 0; j < n_ctx; ++j) {
        const float* kj = kv + (j * d.H + h) * kvw;
        const float* kr = k_rot + j * d.rope;
        float acc = 0.0f;
        for (int64_t i = 0; i < d.nope; ++i) acc += qt[i] * kj[i];
        for (int64_t i = 0; i < d.rope; ++i) acc += qt[d.nope + i] * kr[i];
        s[j] = acc * d.scale;
      }
      softmax_inplace(s, n_ctx);
      float* ot = o + (t * d.H + h) * d.v;
      for (int64_t e = 0; e < d.v; ++e) {
        float acc = 0.0f;
        for (int64_t j = 0; j < n_ctx; ++j) acc += s[j] * kv[(j * d.H + h) * kvw + d.nope + e];
        ot[e] = acc;
      }
    }
  }
}

int64_t mla_absorbed_scratch_floats(const MlaDims& d, int64_t N, int64_t T) {
  return T * (N + 2 * d.r);  // per token: scores [N], q_lat [r], o_lat [r]
}

void mla_attend_absorbed(const MlaDims& d, const float* q, int64_t T, const float* c_kv,
                         const float* k_rot, int64_t N, const TensorView& kv_b_proj, float* o,
                         float* scratch) {
  const int64_t P = N - T, qw = d.nope + d.rope, kvw = d.nope + d.v;
#pragma omp parallel for schedule(static) if (T * N * d.H * d.r > kParallelMinWork)
  for (int64_t t = 0; t < T; ++t) {
    float* s = scratch + t * (N + 2 * d.r);  // [N]
    float* q_lat = s + N;                    // [r]
    float* o_lat = q_lat + d.r;              // [r]
    const int64_t n_ctx = P + t + 1;
    for (int64_t h = 0; h < d.H; ++h) {
      const float* qt = q + (t * d.H + h) * qw;
      // q_lat[c] = sum_i q_nope[i] * W_UK[h][i][c]   (row h*kvw + i of kv_b_proj)
      for (int64_t c = 0; c < d.r; ++c) q_lat[c] = 0.0f;
      for (int64_t i = 0; i < d.nope; ++i) {
        const int64_t wrow = (h * kvw + i) * d.r;
        for (int64_t c = 0; c < d.r; ++c) q_lat[c] += qt[i] * weight_at(kv_b_proj, wrow + c);
      }
      for (int64_t j = 0; j < n_ctx; ++j) {
        const float* cj = c_kv + j * d.r;
        const float* kr = k_rot + j * d.rope;
        float acc = 0.0f;
        for (int64_t c = 0; c < d.r; ++c) acc += q_lat[c] * cj[c];
        for (int64_t i = 0; i < d.rope; ++i) acc += qt[d.nope + i] * kr[i];
        s[j] = acc * d.scale;
      }
      softmax_inplace(s, n_ctx);
      for (int64_t c = 0; c < d.r; ++c) o_lat[c] = 0.0f;
      for (int64_t j = 0; j < n_ctx; ++j) {
        const float* cj = c_kv + j * d.r;
        for (int64_t c = 0; c < d.r; ++c) o_lat[c] += s[j] * cj[c];
      }
      float* ot = o + (t * d.H + h) * d.v;
      for (int64_t e = 0; e < d.v; ++e) {
        const int64_t wrow = (h * kvw + d.nope + e) * d.r;
        float acc = 0.0f;
        for (int64_t c = 0; c < d.r; ++c) acc += weight_at(kv_b_proj, wrow + c) * o_lat[c];
        ot[e] = acc;
      }
    }
  }
}

}  // namespace attnres
