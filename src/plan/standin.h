// Elementwise stand-in sublayer kernel of the lifetime harness (harness.h), Highway-dispatched
// so the stand-ins stay cheap next to the AttnRes reads. Row-local: `out` may alias `in`.
//   kAttention: y = T(a * x + b * s(x) + c[j])
//   kMlp:       y = T(x * (a + b * s(x)) + c[j])        s(x) = clamp(x, -1, 1)
// Every element is computed by one thread with the same operations (no reductions), so the
// result is bitwise independent of the thread count and of the target.
#pragma once

#include <cstdint>

#include "plan/executor.h"

namespace attnres {

enum class StandInKind { kAttention, kMlp };

void standin_elementwise(const ActView& in, const ActView& out, StandInKind kind, float a, float b,
                         const float* offset);

}  // namespace attnres
