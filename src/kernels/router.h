// MoE router (Kimi-K3 / DeepSeek-V3 "noaux_tc" with one group): sigmoid scores in f32 over
// all experts; the top-k of (score + e_score_correction_bias) are chosen (the bias is for
// selection only); their combine weights are the unbiased scores, renormalised
// (/ (sum + 1e-20)) when `renormalize`, times routed_scaling_factor.
//
// Contract: logits [T, E] f32 (= x W_r^T), bias [E]; ids and weights [T, k], ordered by
// descending biased score (ties: lower expert id first). No allocation; `scratch` holds E
// floats per token ([T, E]). Tokens are independent (one thread each). Logits and bias are
// finite and 1 <= top_k <= E.
//
// route_sigmoid_topk (router_hwy.cpp, Highway dispatch) computes the sigmoids in vectors with
// Highway's Exp (<= 1 ulp) and selects in one pass; route_sigmoid_topk_ref (router.cpp) is the
// scalar twin (libm sigmoid, k argmax passes). Given the same scores both select the same ids
// in the same order and produce bitwise the same weights (the weight arithmetic is the twin's).
#pragma once

#include <cstdint>

namespace attnres {

struct RouterOptions {
  int64_t top_k = 0;
  bool renormalize = true;
  float scaling = 1.0f;
  // Test-only misreading: combine with the biased score (s + bias) instead of s.
  bool bias_in_weights = false;
};

void route_sigmoid_topk(const float* logits, const float* bias, int64_t T, int64_t E,
                        const RouterOptions& opt, int32_t* ids, float* weights, float* scratch);
void route_sigmoid_topk_ref(const float* logits, const float* bias, int64_t T, int64_t E,
                            const RouterOptions& opt, int32_t* ids, float* weights, float* scratch);

}  // namespace attnres
