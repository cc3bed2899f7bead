#include "kernels/router.h"
#include "kernels/parallel.h"

#include <cmath>

#include "kernels/activation.h"
#include "util/parallel.h"

namespace attnres {

void route_sigmoid_topk_ref(const float* logits, const float* bias, int64_t T, int64_t E,
                            const RouterOptions& opt, int32_t* ids, float* weights,
                            float* scratch) {
  const int64_t K = opt.top_k;
  parallel_ranges(T, T * E * opt.top_k > kParallelMinWork, [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      float* biased = scratch + t * E;  // [E]; chosen entries are marked by -inf after selection
      const float* lt = logits + t * E;
      for (int64_t e = 0; e < E; ++e) biased[e] = sigmoidf(lt[e]) + (bias ? bias[e] : 0.0f);
      int32_t* it = ids + t * K;
      float* wt = weights + t * K;
      float sum = 0.0f;
      for (int64_t s = 0; s < K; ++s) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e) {
          if (biased[e] == -INFINITY) continue;
          if (best < 0 || biased[e] > biased[best]) best = e;
        }
        it[s] = static_cast<int32_t>(best);
        const float score = sigmoidf(lt[best]);
        wt[s] = opt.bias_in_weights ? biased[best] : score;
        sum += wt[s];
        biased[best] = -INFINITY;
      }
      for (int64_t s = 0; s < K; ++s) {
        if (opt.renormalize) wt[s] = wt[s] / (sum + 1e-20f);
        wt[s] *= opt.scaling;
      }
    }
  });
}

}  // namespace attnres
