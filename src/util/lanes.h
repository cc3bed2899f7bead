// The lane-packed layout of a BF16 matrix W [N, K] (K even), in which one vector lane holds one
// output row (kernels/matmul_lanes.h computes with it; TensorView::layout marks a view of it).
//
// Rows are stored in groups of 64: group g holds rows 64g .. 64g + R_g - 1, where R_g is 64 for
// every group but the last, whose rows are rounded up to a multiple of 16 (zero rows past N).
// Within a group, for each pair q of columns in order, the group's rows' pairs side by side:
// element (n, k) with n = 64g + j lies at 64 g K + (q R_g + j) 2 + (k mod 2), q = k / 2. So a
// pair of 16 rows is one 64-byte vector, and the matrix takes roundup(N, 16) K values.
#pragma once

#include <cstdint>

#include "util/numeric.h"

namespace attnres {

inline constexpr int64_t kLaneGroupRows = 64;
inline constexpr int64_t kLaneRowQuantum = 16;

// Stored rows of group g of an N-row matrix.
inline int64_t lanes_group_rows(int64_t N, int64_t g) {
  const int64_t left = N - g * kLaneGroupRows;
  return left >= kLaneGroupRows ? kLaneGroupRows
                                : (left + kLaneRowQuantum - 1) / kLaneRowQuantum * kLaneRowQuantum;
}

// Values of the packed form of an [N, K] matrix.
inline int64_t lanes_size(int64_t N, int64_t K) {
  return (N + kLaneRowQuantum - 1) / kLaneRowQuantum * kLaneRowQuantum * K;
}

// Position of element (n, k) in the packed form.
inline int64_t lanes_index(int64_t n, int64_t k, int64_t N, int64_t K) {
  const int64_t g = n / kLaneGroupRows;
  return g * kLaneGroupRows * K + ((k / 2) * lanes_group_rows(N, g) + n % kLaneGroupRows) * 2 +
         k % 2;
}

// w [N, K] row-major -> out [lanes_size(N, K)] in the layout above. K must be even.
void pack_bf16_lanes(const bf16* w, int64_t N, int64_t K, bf16* out);
// Group g alone: `rows` holds its min(64, N - 64g) rows row-major; writes its stored rows at
// out + 64 g K (out is the whole packed matrix).
void pack_bf16_lanes_group(const bf16* rows, int64_t g, int64_t N, int64_t K, bf16* out);

}  // namespace attnres
