// The reference forward step of one sequence: the straightforward dataflow of HF's
// KimiK3DecoderLayer loop (k3-model.md section 2), every value in its own storage and a scalar
// AttnRes read. It defines what the production path (model/planned.h, the storage executor
// over batched steps) must compute; tests compare the two and the golden data with it. It also
// honours the test-only misreadings of the AttnRes schedule and reports intermediates.
//
// Contract: one step over T new tokens at positions state.position .. +T-1; the state absorbs
// them. Token ids are checked (kInvalidArgument naming the position). Scratch comes from
// `arena`, which the caller resets between steps.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model/forward.h"
#include "util/limits.h"

namespace attnres {

// Known misreadings of the AttnRes schedule (issue 4 part 5). All false in a correct run;
// tests switch one on and check that the golden comparison then fails by a wide margin. (The
// in-sublayer misreadings are weight bindings instead: KdaWeights::a_log_group,
// MoeWeights::combine_with_bias.)
struct Misreadings {
  bool block_in_sublayers = false;  // commit when (2 i) % B == 0 instead of i % B == 0
  bool commit_mixture = false;      // bank the pre-attention mixture instead of the running sum
  bool skip_final_read = false;     // final norm on the running sum, no output mixture
};

// Receives named intermediates ("embed", "layer3.attn_out", "layer3.bank.1", "final_norm", ...);
// data is [rows, cols] f32. Used by the per-layer golden tests.
using CaptureFn =
    std::function<void(const std::string& name, const float* data, int64_t rows, int64_t cols)>;

// Runs the step and writes logits [T, V] (all_logits) or [1, V] (the last row only).
Status reference_forward(const ModelWeights& weights, SequenceState& state,
                         const ForwardOptions& opt, Arena& arena, const int32_t* tokens, int64_t T,
                         bool all_logits, float* logits, const CaptureFn* capture = nullptr,
                         const Misreadings& mis = {});

// Most sources one reference AttnRes read may have (util/limits.h; config validation enforces
// it).
inline constexpr int kMaxReadSources = kMaxAttnResSources;

// Scalar AttnRes read over S <= kMaxReadSources sources (sources[j] is [T, d]):
//   score_j = dot(v_j, q) * rsqrt(mean(v_j^2) + eps); p = softmax(score); out = sum_j p_j v_j,
// in f32, rounded to bf16 when bf16_out. out must not alias a source.
void model_attnres_read(const float* const* sources, int S, const float* q, int64_t T, int64_t d,
                        float eps, bool bf16_out, float* out);

}  // namespace attnres
