// Projections y = x W^T over a stored weight matrix.
//
// Contract: x is [T, K] f32 row-major, W is [N, K] (BF16 or F32, torch Linear layout), y is
// [T, N] f32; y must not alias x. Each output element is one dot product accumulated by one
// thread in a fixed order, so results do not depend on the thread count. The scalar
// reference (`*_ref`) defines the numerics; the dispatched path is tested against it.
#pragma once

#include <cstdint>

#include "util/tensor.h"

namespace attnres {

// Dispatched (fast) path: Highway kernels (matmul_hwy.cpp) for the best target this CPU
// supports, OpenMP over output rows. Accumulation order per output: see matmul_hwy.cpp.
void matmul(const float* x, int64_t T, const TensorView& W, float* y);
// Scalar reference: f64-free, f32 accumulation in k order.
void matmul_ref(const float* x, int64_t T, const TensorView& W, float* y);

// bf16 activations x [T, K] (e.g. the bf16 flow, where projection inputs are bf16 values);
// W as for matmul(). A bf16 x bf16 product is exact in f32, so this is the same dot product as
// matmul() on the widened x, accumulated in another fixed order (thread-count invariant, same
// for T = 1 and T > 1). With BF16 weights on a CPU with AVX512_BF16 it runs on vdpbf16ps (two
// products per lane per instruction), which treats subnormal inputs and results as zero; other
// CPUs widen x on load. The reference widens both and accumulates in k order.
void matmul_bf16(const bf16* x, int64_t T, const TensorView& W, float* y);
void matmul_bf16_ref(const bf16* x, int64_t T, const TensorView& W, float* y);
// Whether matmul_bf16 with BF16 weights uses vdpbf16ps on this CPU.
bool matmul_bf16_uses_dot_product();

// MXFP4 [N, K]: packed [N, K/2] (low nibble = even k), scale [N, K/32] E8M0; K % 32 == 0.
// Computed straight from the packed nibbles; no dequantised copy is kept.
void mxfp4_matmul(const float* x, int64_t T, const uint8_t* packed, const uint8_t* scale, int64_t N,
                  int64_t K, float* y);
void mxfp4_matmul_ref(const float* x, int64_t T, const uint8_t* packed, const uint8_t* scale,
                      int64_t N, int64_t K, float* y);

// Name of the Highway target the dispatched kernels run on here ("AVX3" = AVX-512, "AVX2",
// "SSE4", "SSSE3", "SCALAR"); chosen once from the CPU's features.
const char* matmul_simd_target();

}  // namespace attnres
