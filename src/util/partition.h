// Balanced contiguous partitions for tensor parallelism (../shared/docs/parallel.md): rank r of P
// owns units [n*r/P, n*(r+1)/P) of a dimension of n units (whole heads where heads are split,
// single rows elsewhere). Every rank computes every rank's range from (n, P) alone, so the
// partition of any dimension is known everywhere without communication, and any P works,
// including one that divides nothing (range sizes differ by at most one unit).
#pragma once

#include <cstdint>

namespace attnres {

struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// This process's place among the ranks that share one model.
struct Shard {
  int rank = 0;
  int ranks = 1;

  bool sharded() const { return ranks > 1; }
  // Rank r's units of a dimension of n units.
  static Range range_of(int64_t n, int r, int ranks) {
    return {n * r / ranks, n * (r + 1) / ranks};
  }
  Range range(int64_t n) const { return range_of(n, rank, ranks); }
  Range range_of(int64_t n, int r) const { return range_of(n, r, ranks); }
  // The most units any rank owns: ceil(n / ranks). Rank-independent sizes (memory budgets that
  // decide admission) use it so that every rank makes the same decisions.
  int64_t max_units(int64_t n) const { return (n + ranks - 1) / ranks; }
};

}  // namespace attnres
