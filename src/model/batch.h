// One forward step over several sequences. The step's T rows are split into segments: each is
// a run of consecutive rows holding the next tokens of one sequence (a prefill chunk or one
// decode token), at that sequence's positions state->position .. + rows - 1.
//
// Invariant: segments are in row order, contiguous and cover [0, T); no two segments of one
// step belong to the same sequence. Everything that works on rows (projections, router,
// experts, norms, AttnRes reads, lm_head) computes each row with arithmetic that depends only
// on that row, so a sequence's results never depend on the other segments of its steps; the
// KDA and MLA cores run per segment against the segment's own state (model/blocks.h).
#pragma once

#include <cstdint>
#include <span>

#include "model/state.h"

namespace attnres {

struct Segment {
  SequenceState* state = nullptr;
  int64_t row0 = 0;  // first row of the step
  int64_t rows = 0;  // tokens
};

using Segments = std::span<const Segment>;

// Before a step: room in every segment's latent cache for its rows. Nothing is written, so a
// failure (the pool is full) leaves every sequence as it was.
Status reserve_segments(Segments segments);
// After a step: every segment's sequence has absorbed its rows.
void advance_segments(Segments segments);

}  // namespace attnres
