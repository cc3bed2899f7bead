// Static contiguous split of an index range over the OpenMP team, for the dispatched row kernels
// (norm_hwy.cpp, router_hwy.cpp, conv_gate_hwy.cpp): the parallel region lives in target-
// independent code and each thread makes one HWY_DYNAMIC_DISPATCH call on its range. (A region
// inside a per-target function is outlined by clang 14 without the target's attributes, and
// inlined vector code then fails in its backend.)
//
// Which thread computes an index depends on the thread count; callers only split work whose
// per-index arithmetic does not depend on the split, so results do not either.
#pragma once

#include <omp.h>

#include <cstdint>

namespace attnres {

// body(begin, end) on thread i of n for [count * i / n, count * (i + 1) / n), skipping empty
// ranges; the whole range on the calling thread when !parallel.
template <class Body>
void for_static_ranges(int64_t count, bool parallel, const Body& body) {
#pragma omp parallel if (parallel)
  {
    const int64_t id = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t begin = count * id / nt, end = count * (id + 1) / nt;
    if (begin < end) body(begin, end);
  }
}

}  // namespace attnres
