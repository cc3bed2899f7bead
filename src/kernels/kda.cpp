#include "kernels/kda.h"
#include "kernels/parallel.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/activation.h"
#include "util/parallel.h"

namespace attnres {
namespace {

// y[0..n) += a * x[0..n): each y[j] gets one more term of its own sum, so a loop of axpys over
// rows accumulates every output in the same order as the element-wise dot product it replaces
// (bitwise equal), while the inner loop is contiguous and vectorises.
inline void axpy(float a, const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += a * x[j];
}

// out[d] = exp(x[d] - y[d]) (y null: exp(x[d])) over the double cumulative gates, from the split
// exponent (kda_gate_split): exp(hi) * (1 + lo). lo [n] is scratch.
void gate_exps(const double* x, const double* y, int64_t n, float* lo, float* out) {
  kda_gate_split(x, y, n, out, lo);
  for (int64_t d = 0; d < n; ++d) {
    const float e = std::exp(out[d]);
    out[d] = e + e * lo[d];
  }
}

}  // namespace

void kda_recurrent_ref(const float* q, const float* k, const float* v, const float* g,
                       const float* beta, int64_t T, int64_t H, int64_t dk, int64_t dv,
                       float* state, float* o) {
  parallel_ranges(H, T * H * dk * dv > kParallelMinWork, [&](int64_t h_begin, int64_t h_end) {
    for (int64_t h = h_begin; h < h_end; ++h) {
      float* S = state + h * dk * dv;  // [dk, dv]
      for (int64_t t = 0; t < T; ++t) {
        const float* qt = q + (t * H + h) * dk;
        const float* kt = k + (t * H + h) * dk;
        const float* vt = v + (t * H + h) * dv;
        const float* gt = g + (t * H + h) * dk;
        const float bt = beta[t * H + h];
        float* ot = o + (t * H + h) * dv;
        for (int64_t i = 0; i < dk; ++i) {
          const float a = std::exp(gt[i]);
          for (int64_t j = 0; j < dv; ++j) S[i * dv + j] *= a;
        }
        // ot temporarily holds S^T k, then the delta (v - S^T k) * beta; o never aliases the
        // inputs. The sums over i run row by row (i outer, j inner: contiguous, vectorisable);
        // every ot[j] still accumulates its terms in increasing i from 0.
        for (int64_t j = 0; j < dv; ++j) ot[j] = 0.0f;
        for (int64_t i = 0; i < dk; ++i) axpy(kt[i], S + i * dv, ot, dv);
        for (int64_t j = 0; j < dv; ++j) ot[j] = (vt[j] - ot[j]) * bt;
        for (int64_t i = 0; i < dk; ++i) axpy(kt[i], ot, S + i * dv, dv);
        // ot is consumed by the update above; now o_t = S^T q (same order as above).
        float* acc = ot;
        for (int64_t j = 0; j < dv; ++j) acc[j] = 0.0f;
        for (int64_t i = 0; i < dk; ++i) axpy(qt[i], S + i * dv, acc, dv);
      }
    }
  });
}

namespace {

int64_t per_head_scratch(int64_t C, int64_t dk, int64_t dv) {
  // gc [C, dk] doubles (2 floats each), A [C, C], w [C, dk], u [C, dv], exp(gc) rows [C, dk],
  // Aqk row [C], q decayed row [dk], exponentials and their low parts [2, dk], kd, qd [C, dk] (rows
  // decayed to their sub-block start), kuT [nb, dk, C] (keys grown from each sub-block start,
  // transposed), factored [nb], acc row [max(dv, C)]. Rounded up to an even count so that every
  // head's gc starts 8-byte aligned.
  const int64_t n = 2 * C * dk + C * C + C * dk + C * dv + C * dk + C + 3 * dk + 2 * C * dk +
                    kda_sub_blocks(C) * C * dk + kda_sub_blocks(C) + std::max(dv, C);
  return (n + 1) / 2 * 2;
}

}  // namespace

void kda_cumulative_gates(const float* g, int64_t t0, int64_t L, int64_t H, int64_t h, int64_t dk,
                          double* gc) {
  for (int64_t c = 0; c < L; ++c) {
    const float* gt = g + ((t0 + c) * H + h) * dk;
    for (int64_t d = 0; d < dk; ++d)
      gc[c * dk + d] = static_cast<double>(gt[d]) + (c ? gc[(c - 1) * dk + d] : 0.0);
  }
}

void kda_gate_split(const double* x, const double* y, int64_t n, float* hi, float* lo) {
  for (int64_t d = 0; d < n; ++d) {
    const double e = y ? x[d] - y[d] : x[d];
    hi[d] = static_cast<float>(e);
    lo[d] = static_cast<float>(e - static_cast<double>(hi[d]));
  }
}

bool kda_sub_block_factored(const double* gc, int64_t s0, int64_t s1, int64_t dk) {
  double span = 0.0;  // largest decay inside the sub-block: gc_s - gc_last >= 0
  for (int64_t d = 0; d < dk; ++d) span = std::max(span, gc[s0 * dk + d] - gc[(s1 - 1) * dk + d]);
  return span <= kKdaMaxFactorLog;
}

int64_t kda_chunk_scratch_floats(int64_t H, int64_t chunk, int64_t dk, int64_t dv) {
  return H * per_head_scratch(chunk, dk, dv);
}

void kda_chunked_ref(const float* q, const float* k, const float* v, const float* g,
                     const float* beta, int64_t T, int64_t H, int64_t dk, int64_t dv, int64_t chunk,
                     float* state, float* o, float* scratch) {
  const int64_t C = chunk, NB = kda_sub_blocks(C);
  parallel_ranges(H, T * H * dk * dv > kParallelMinWork, [&](int64_t h_begin, int64_t h_end) {
    for (int64_t h = h_begin; h < h_end; ++h) {
      float* S = state + h * dk * dv;  // [dk, dv]
      float* head = scratch + h * per_head_scratch(C, dk, dv);
      assert(reinterpret_cast<uintptr_t>(head) % alignof(double) == 0);
      double* gc = reinterpret_cast<double*>(head);  // [C, dk] cumulative log decay
      float* A = head + 2 * C * dk;                  // [C, C]
      float* w = A + C * C;                          // [C, dk]
      float* u = w + C * dk;                         // [C, dv]
      float* eg = u + C * dv;                        // [C, dk] exp(gc) rows (kg, then qg)
      float* aqk = eg + C * dk;                      // [C]
      float* qg = aqk + C;                           // [dk] q_c * exp(gc_c)
      float* ex = qg + dk;                           // [dk] one row of decay factors (gate_exps)
      float* lo = ex + dk;                           // [dk] their exponents' low parts
      float* kd = lo + dk;                           // [C, dk] k_c exp(gc_c - gc_s(c))
      float* qd = kd + C * dk;                       // [C, dk] q_c exp(gc_c - gc_s(c))
      float* kuT = qd + C * dk;                      // [NB, dk, C] k_i[d] exp(gc_s_b[d] - gc_i[d])
      float* factored = kuT + NB * C * dk;           // [NB] 1 = factored form usable
      float* accr = factored + NB;                   // [max(dv, C)] one row of partial sums
      auto row = [H, h](int64_t t, int64_t width) { return (t * H + h) * width; };
      for (int64_t t0 = 0; t0 < T; t0 += C) {
        const int64_t L = std::min(C, T - t0);
        kda_cumulative_gates(g, t0, L, H, h, dk, gc);
        for (int64_t b = 0; b * kKdaSubBlock < L; ++b) {
          const int64_t s0 = b * kKdaSubBlock, s1 = std::min(L, s0 + kKdaSubBlock);
          factored[b] = kda_sub_block_factored(gc, s0, s1, dk) ? 1.0f : 0.0f;
          if (factored[b] == 0.0f) continue;
          for (int64_t c = s0; c < s1; ++c) {
            const float* kc = k + row(t0 + c, dk);
            const float* qc = q + row(t0 + c, dk);
            gate_exps(gc + c * dk, gc + s0 * dk, dk, lo, ex);
            for (int64_t d = 0; d < dk; ++d) {
              kd[c * dk + d] = kc[d] * ex[d];
              qd[c * dk + d] = qc[d] * ex[d];
            }
          }
          float* kub = kuT + b * dk * C;  // [dk, C]
          for (int64_t i = 0; i < s1; ++i) {
            const float* ki = k + row(t0 + i, dk);
            gate_exps(gc + s0 * dk, gc + i * dk, dk, lo, ex);
            for (int64_t d = 0; d < dk; ++d) kub[d * C + i] = ki[d] * ex[d];
          }
        }
        // out[i] = x_c . diag(exp(gc_c - gc_i)) k_i for i < n (n <= c + 1), x = k (A) or q (Aqk).
        // Factored sub-blocks: sum over d of xd_c[d] * kuT[d][i], d outer so that the inner loop
        // over i is contiguous; each out[i] still sums its terms in increasing d.
        auto decayed_dots = [&](const float* x, const float* xd, int64_t c, int64_t n, float* out) {
          const int64_t b = c / kKdaSubBlock;
          if (factored[b] != 0.0f) {
            const float* xr = xd + c * dk;
            const float* kub = kuT + b * dk * C;
            for (int64_t i = 0; i < n; ++i) out[i] = 0.0f;
            for (int64_t d = 0; d < dk; ++d) axpy(xr[d], kub + d * C, out, n);
          } else {
            for (int64_t i = 0; i < n; ++i) {
              const float* ki = k + row(t0 + i, dk);
              float acc = 0.0f;
              for (int64_t d = 0; d < dk; ++d)
                acc += x[d] * std::exp(static_cast<float>(gc[c * dk + d] - gc[i * dk + d])) * ki[d];
              out[i] = acc;
            }
          }
        };
        // A[c][i] (i < c) = -beta_c * sum_d k_c[d] exp(gc_c[d] - gc_i[d]) k_i[d]
        for (int64_t c = 0; c < L; ++c) {
          const float* kc = k + row(t0 + c, dk);
          const float bc = beta[(t0 + c) * H + h];
          float* Ac = A + c * C;
          decayed_dots(kc, kd, c, c, Ac);
          for (int64_t i = 0; i < c; ++i) Ac[i] = -Ac[i] * bc;
          for (int64_t i = c; i < L; ++i) Ac[i] = 0.0f;
        }
        // Forward substitution: rows become those of (I - A_strict)^-1 - I.
        for (int64_t c = 1; c < L; ++c) {
          for (int64_t i = 0; i < c; ++i) {
            float acc = A[c * C + i];
            for (int64_t m = i + 1; m < c; ++m) acc += A[c * C + m] * A[m * C + i];
            A[c * C + i] = acc;
          }
        }
        // T = (A + I) diag(beta); w = T (exp(gc) * k); u = T v. The decayed keys exp(gc_i) k_i
        // (<= 1 in magnitude) go into kd, whose sub-block rows are no longer needed.
        float* kg = kd;  // [C, dk]
        for (int64_t i = 0; i < L; ++i) {
          const float* ki = k + row(t0 + i, dk);
          gate_exps(gc + i * dk, nullptr, dk, lo, eg + i * dk);
          for (int64_t d = 0; d < dk; ++d) kg[i * dk + d] = eg[i * dk + d] * ki[d];
        }
        for (int64_t c = 0; c < L; ++c) {
          for (int64_t d = 0; d < dk; ++d) w[c * dk + d] = 0.0f;
          for (int64_t j = 0; j < dv; ++j) u[c * dv + j] = 0.0f;
          for (int64_t i = 0; i <= c; ++i) {
            const float tci = (i == c ? 1.0f : A[c * C + i]) * beta[(t0 + i) * H + h];
            const float* vi = v + row(t0 + i, dv);
            for (int64_t d = 0; d < dk; ++d) w[c * dk + d] += tci * kg[i * dk + d];
            for (int64_t j = 0; j < dv; ++j) u[c * dv + j] += tci * vi[j];
          }
        }
        // v_new = u - w S  (stored in u); the sum over d runs row by row (axpy, see above).
        for (int64_t c = 0; c < L; ++c) {
          for (int64_t j = 0; j < dv; ++j) accr[j] = 0.0f;
          for (int64_t d = 0; d < dk; ++d) axpy(w[c * dk + d], S + d * dv, accr, dv);
          for (int64_t j = 0; j < dv; ++j) u[c * dv + j] -= accr[j];
        }
        // o_c = (q_c * exp(gc_c)) S + sum_{j<=c} Aqk[c][j] v_new_j (terms in that order)
        for (int64_t c = 0; c < L; ++c) {
          const float* qc = q + row(t0 + c, dk);
          decayed_dots(qc, qd, c, c + 1, aqk);
          for (int64_t d = 0; d < dk; ++d) qg[d] = qc[d] * eg[c * dk + d];
          float* oc = o + row(t0 + c, dv);
          for (int64_t e = 0; e < dv; ++e) oc[e] = 0.0f;
          for (int64_t d = 0; d < dk; ++d) axpy(qg[d], S + d * dv, oc, dv);
          for (int64_t j = 0; j <= c; ++j) axpy(aqk[j], u + j * dv, oc, dv);
        }
        // S = diag(exp(gc_last)) S + sum_c (exp(gc_last - gc_c) * k_c) v_new_c^T; the decayed
        // keys go into w (w is dead once v_new is formed).
        const double* gl = gc + (L - 1) * dk;
        float* kdec = w;  // [C, dk]
        for (int64_t c = 0; c < L; ++c) {
          gate_exps(gl, gc + c * dk, dk, lo, ex);
          for (int64_t d = 0; d < dk; ++d) kdec[c * dk + d] = ex[d] * k[row(t0 + c, dk) + d];
        }
        gate_exps(gl, nullptr, dk, lo, ex);  // the state's decay over the chunk
        for (int64_t d = 0; d < dk; ++d) {
          const float decay = ex[d];
          float* Sd = S + d * dv;
          for (int64_t e = 0; e < dv; ++e) Sd[e] *= decay;
          for (int64_t c = 0; c < L; ++c) axpy(kdec[c * dk + d], u + c * dv, Sd, dv);
        }
      }
    }
  });
}

}  // namespace attnres
