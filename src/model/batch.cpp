#include "model/batch.h"

namespace attnres {

Status reserve_segments(Segments segments) {
  for (const Segment& s : segments)
    ATTNRES_RETURN_IF_ERROR(s.state->cache.reserve(s.state->position + s.rows));
  return Status::ok();
}

void advance_segments(Segments segments) {
  for (const Segment& s : segments) {
    s.state->position += s.rows;
    s.state->cache.set_size(s.state->position);
  }
}

}  // namespace attnres
