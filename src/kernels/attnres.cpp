// Scalar reference of the AttnRes read and step (attnres.h). This file defines the numerics:
// sequential fp32 reductions, the storage cast after every add, the mix summed in source order
// with a separate multiply and add, KimiRMSNorm (normalise in fp32, cast, times the gain, cast).
#include <cassert>
#include <cstring>
#include <type_traits>

#include "kernels/attnres.h"

namespace attnres {
namespace {

template <typename T>
inline float cast_f(float x) {
  return storage_to_f32<T>(f32_to_storage<T>(x));
}

template <typename T>
float sumsq_row(const T* v, int64_t d) {
  float s = 0.0f;
  for (int64_t j = 0; j < d; ++j) {
    const float x = storage_to_f32(v[j]);
    s += x * x;
  }
  return s;
}

template <typename T>
float dot_row(const T* v, const float* q, int64_t d) {
  float s = 0.0f;
  for (int64_t j = 0; j < d; ++j) s += storage_to_f32(v[j]) * q[j];
  return s;
}

// One row of the read: rows[j] are the n source rows; writes T(mixture) to out (may alias a
// source row: column j is written after every source's column j was read).
template <typename T>
void read_row(const T* const* rows, int n, int64_t d, const float* q, float eps, T* out) {
  float p[kMaxAttnResSources] = {};
  if (n == 1) {
    p[0] = 1.0f;  // the skipped read: softmax over one source is exactly 1
  } else {
    for (int j = 0; j < n; ++j) {
      p[j] = dot_row(rows[j], q, d) * attnres_inv_rms(sumsq_row(rows[j], d), d, eps);
    }
    attnres_softmax(p, n);
  }
  for (int64_t c = 0; c < d; ++c) {
    float acc = p[0] * storage_to_f32(rows[0][c]);
    for (int j = 1; j < n; ++j) {
      const float term = p[j] * storage_to_f32(rows[j][c]);
      acc = acc + term;
    }
    out[c] = f32_to_storage<T>(acc);
  }
}

template <typename T>
void read_ref(const T* const* sources, int n, int64_t tokens, int64_t d, const float* q, float eps,
              T* out) {
  assert(n >= 1 && n <= kMaxAttnResSources);
  const T* rows[kMaxAttnResSources];
  for (int64_t t = 0; t < tokens; ++t) {
    for (int j = 0; j < n; ++j) rows[j] = sources[j] + t * d;
    read_row(rows, n, d, q, eps, out + t * d);
  }
}

template <typename T>
void step_ref(const AttnResStepArgs<T>& a) {
  const int64_t d = a.dim;
  const int n = a.num_sources();
  assert(n >= 1 && n <= kMaxAttnResSources);
  assert((a.rs_in != nullptr) || (a.pending != nullptr));
  assert(!(a.rs_in && a.pending) || a.rs_out != nullptr);
  assert(a.commit == nullptr || a.commit_inv_rms != nullptr);
  for (int64_t t = 0; t < a.tokens; ++t) {
    const int64_t o = t * d;
    // 1. Delayed add.
    const T* rs;
    if (a.rs_in && a.pending) {
      for (int64_t j = 0; j < d; ++j) {
        a.rs_out[o + j] =
            f32_to_storage<T>(storage_to_f32(a.rs_in[o + j]) + storage_to_f32(a.pending[o + j]));
      }
      rs = a.rs_out + o;
    } else {
      rs = (a.rs_in ? a.rs_in : a.pending) + o;
    }
    // 2. Commit.
    if (a.commit) {
      if (a.commit + o != rs) std::memmove(a.commit + o, rs, static_cast<size_t>(d) * sizeof(T));
      a.commit_inv_rms[t] = attnres_inv_rms(sumsq_row(rs, d), d, a.res_eps);
    }
    // 3. Read.
    const T* rows[kMaxAttnResSources];
    for (int s = 0; s < a.num_slots; ++s) rows[s] = a.slots[s] + o;
    rows[a.num_slots] = rs;
    T* out = a.out + o;
    read_row(rows, n, d, a.query, a.res_eps, out);
    if (a.raw_mixture) std::memcpy(a.raw_mixture + o, out, static_cast<size_t>(d) * sizeof(T));
    // 4. RMSNorm (KimiRMSNorm): normalise in fp32, cast, times the gain, cast.
    const float inv = attnres_inv_rms(sumsq_row(out, d), d, a.norm_eps);
    for (int64_t j = 0; j < d; ++j) {
      const float x = cast_f<T>(storage_to_f32(out[j]) * inv);
      out[j] = f32_to_storage<T>(x * a.norm_weight[j]);
    }
  }
}

}  // namespace

void attnres_step_ref(const AttnResStepArgs<bf16>& a) {
  step_ref(a);
}
void attnres_step_ref(const AttnResStepArgs<float>& a) {
  step_ref(a);
}

void attnres_read_ref(const bf16* const* sources, int num_sources, int64_t tokens, int64_t dim,
                      const float* query, float eps, bf16* out) {
  read_ref(sources, num_sources, tokens, dim, query, eps, out);
}
void attnres_read_ref(const float* const* sources, int num_sources, int64_t tokens, int64_t dim,
                      const float* query, float eps, float* out) {
  read_ref(sources, num_sources, tokens, dim, query, eps, out);
}

}  // namespace attnres
