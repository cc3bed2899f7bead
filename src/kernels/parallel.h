// Threshold below which a kernel runs its loop on the calling thread: spawning or waking a
// team costs microseconds (far more on an oversubscribed machine), more than small loops take.
// Whether a loop runs in parallel never changes its results: each output element is computed
// by one thread in a fixed order either way.
#pragma once

#include <cstdint>

namespace attnres {
inline constexpr int64_t kParallelMinWork = int64_t{1} << 16;
}  // namespace attnres
