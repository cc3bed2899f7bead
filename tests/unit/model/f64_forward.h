// A float64 evaluation of the Kimi-K3 forward pass (../shared/docs/k3-model.md sections 2-5)
// over the weights as stored (BF16 / F32 widened, MXFP4 decoded), for accuracy tests: the
// engine's f32 logits against this one measure its rounding error.
//
// It is written from the model description, not from the engine's code: no engine kernel,
// no folded query, no chunked KDA form. Every value is a double; the KDA delta rule runs token
// by token (the definition), MLA attends with expanded keys, the AttnRes reads are plain
// softmax mixtures. What it shares with the engine is the meaning of the checkpoint (binding
// through load_model(), the config's layer schedule), which is the point: the two compute the
// same function.
//
// Contract: one sequence from position 0, all T rows at once; returns logits [T, V]. Slow
// (scalar, O(T^2) attention); meant for models of a few hundred thousand parameters per layer.
// Expert routing takes the top-k of the f64 scores, so it is comparable with an f32 run only on
// a model whose routing cannot flip (the "deep" preset routes every expert).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "io/weights.h"

namespace attnres::testing {

std::vector<double> f64_forward(const ModelWeights& weights, std::span<const int32_t> tokens);

}  // namespace attnres::testing
