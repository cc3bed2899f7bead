// Sampling parameters of a generation request (public API). The numerics of every field are
// defined in src/kernels/sampling.h (sample_token_ref).
#pragma once

#include <cstdint>

namespace attnres {

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy
  int32_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off
  float presence_penalty = 0.0f;    // 0 = off
  float frequency_penalty = 0.0f;   // 0 = off
  uint64_t seed = 0;
};

}  // namespace attnres
