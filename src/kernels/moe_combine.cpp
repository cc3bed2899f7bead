#include "kernels/moe_combine.h"

namespace attnres {

void moe_combine_ref(const float* x, int64_t ldx, const int64_t* rows, const float* w, int64_t k,
                     int64_t n, float* y) {
  for (int64_t s = 0; s < k; ++s) {
    const float* xs = x + rows[s] * ldx;
    for (int64_t i = 0; i < n; ++i) y[i] += w[s] * xs[i];
  }
}

}  // namespace attnres
