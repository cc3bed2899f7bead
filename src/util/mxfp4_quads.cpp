// Packing MXFP4 codes into row quads (util/mxfp4_quads.h).
#include "util/mxfp4_quads.h"

#include <cassert>
#include <cstring>
#include <vector>

namespace attnres {

void pack_mxfp4_quad(const uint8_t* rows, int64_t g, int64_t K, uint8_t* out) {
  assert(K % (2 * kMxfp4BlockSize) == 0);
  const int64_t R = K / 2;
  uint8_t* quad = out + g * kMxfp4QuadRows * R;
  for (int64_t p = 0; p < R / 32; ++p)  // the quad's storage in order
    for (int64_t j = 0; j < kMxfp4QuadRows; ++j)
      std::memcpy(quad + p * kMxfp4QuadPairBytes + j * 32, rows + j * R + p * 32, 32);
}

void pack_mxfp4_quads(const uint8_t* packed, int64_t N, int64_t K, uint8_t* out) {
  assert(mxfp4_quads_fit(N, K));
  for (int64_t g = 0; g * kMxfp4QuadRows < N; ++g)
    pack_mxfp4_quad(packed + g * kMxfp4QuadRows * (K / 2), g, K, out);
}

void pack_mxfp4_quads_in_place(uint8_t* codes, int64_t N, int64_t K) {
  assert(mxfp4_quads_fit(N, K));
  const int64_t quad_bytes = kMxfp4QuadRows * (K / 2);
  std::vector<uint8_t> rows(static_cast<size_t>(quad_bytes));
  for (int64_t g = 0; g * kMxfp4QuadRows < N; ++g) {
    std::memcpy(rows.data(), codes + g * quad_bytes, static_cast<size_t>(quad_bytes));
    pack_mxfp4_quad(rows.data(), g, K, codes);
  }
}

}  // namespace attnres
