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
// supports, the pool's threads over output rows. Accumulation order per output: see matmul_hwy.cpp,
// and matmul_lanes.h for a lane-packed W.
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
// out[i] = x[i] as bf16 for i < n; returns false (out then unspecified) when some x[i] is not
// exactly representable in bf16. A NaN is copied as the quiet bf16 NaN of its sign (a product
// with it is NaN either way), so one NaN row never moves the other rows of a batch to another
// kernel: in the bf16 flow every projection input is a bf16 value, and the copy always succeeds.
bool bf16_exact_copy(const float* x, int64_t n, bf16* out);
bool bf16_exact_copy_ref(const float* x, int64_t n, bf16* out);  // scalar twin (same bits)

// MXFP4 [N, K]: packed [N, K/2] (low nibble = even k), scale [N, K/32] E8M0; K % 32 == 0.
// Computed straight from the packed nibbles (no dequantised copy is kept) with the arithmetic
// and bits of the lane kernels (mxfp4_lanes.h): one job of matmul_batch.
void mxfp4_matmul(const float* x, int64_t T, const uint8_t* packed, const uint8_t* scale, int64_t N,
                  int64_t K, float* y);
void mxfp4_matmul_ref(const float* x, int64_t T, const uint8_t* packed, const uint8_t* scale,
                      int64_t N, int64_t K, float* y);

// ------------------------------------------------------------------------------------------
// Batched projections: several independent products y_j = x_j W_j^T in ONE parallel region.
// A parallel region costs a fork/join and a barrier (tens of microseconds on a loaded 2-core
// machine), so a decode step that issues dozens of small projections per layer is dominated by
// them; batching the projections that are ready at the same time (q/k/v/g sharing an input, the
// routed experts of a step) removes most regions.
//
// Each output element is computed with exactly the arithmetic of matmul() / mxfp4_matmul() for
// that job (bitwise equal; only the split of rows over threads differs), so results do not depend
// on the thread count or on how jobs are grouped into batches. Jobs must not write to memory
// another job of the batch reads.
// kBF16Lanes: BF16 weights in the lane-packed layout (matmul_lanes.h: its arithmetic and bits,
// with xh or x alike); rows are split over threads in whole groups of 64.
// kMxfp4 (row-major codes and scales) and kMxfp4Lanes (both in the 16-row lane layout,
// util/mxfp4_lanes.h): the lane kernels' arithmetic and bits (mxfp4_lanes.h) from either
// layout, with xh or x alike; rows are split over threads in groups of 16.
enum class WeightKind : uint8_t { kF32, kBF16, kMxfp4, kBF16Lanes, kMxfp4Lanes };
inline bool is_mxfp4(WeightKind k) {
  return k == WeightKind::kMxfp4 || k == WeightKind::kMxfp4Lanes;
}

struct MatmulJob {
  const float* x = nullptr;  // [T, K] f32
  // Optional: the same [T, K] values as bf16, set only when every x value is exactly a bf16
  // value (bf16_exact_copy). Then BF16 jobs run on vdpbf16ps where the CPU has AVX512_BF16
  // (matmul_bf16's arithmetic: the same exact products as with f32 x, another fixed summation
  // order, subnormal inputs flushed), and MXFP4 and lane-packed jobs read xh (their kernels
  // give the bits of x from it, up to vdpbf16ps's flushing of subnormals); elsewhere, and for
  // F32 weights, x is used as usual. Where matmul_bf16_uses_dot_product(), a BF16 or MXFP4 job
  // with xh reads xh alone, and x may be null (a caller that has its tokens only as bf16).
  const bf16* xh = nullptr;
  int64_t T = 0;  // tokens (rows of x and y); 0 = nothing to do
  WeightKind kind = WeightKind::kBF16;
  const void* w = nullptr;         // [N, K] f32 or bf16 (kBF16Lanes: packed); MXFP4: codes [N, K/2]
  const uint8_t* scale = nullptr;  // MXFP4 E8M0 scales [N, K/32] (kMxfp4Lanes: packed)
  int64_t N = 0, K = 0;
  float* y = nullptr;  // [T, N] f32, rows ldy apart
  int64_t ldy = 0;     // row stride of y; 0 = N
  // Round each output to the nearest bf16 value (round_bf16, kept in f32), done by the thread
  // that computed it right after its rows (a bf16 nn.Linear output).
  bool round_bf16 = false;
  // kMxfp4Lanes: no scale byte of W is 0 or 255 (ExpertMatrix::normal_scales), so the kernels
  // skip those bytes' special cases (mxfp4_lanes_rows). Same bits; false is always correct.
  bool normal_scales = false;
};

// A job over a dense BF16/F32 matrix W [N, K] (a torch Linear weight, row-major or lane-packed),
// or over rows [row0, row0 + rows) of a row-major one.
MatmulJob dense_job(const float* x, int64_t T, const TensorView& W, float* y);
MatmulJob dense_rows_job(const float* x, int64_t T, const TensorView& W, int64_t row0, int64_t rows,
                         float* y);
// A job over a plain f32 matrix w [N, K] (e.g. cached context rows acting as weight rows).
MatmulJob f32_job(const float* x, int64_t T, const float* w, int64_t N, int64_t K, float* y);
// The same over a plain bf16 matrix w [N, K] (widened exactly: the same values as f32_job on
// the widened matrix).
MatmulJob bf16_job(const float* x, int64_t T, const bf16* w, int64_t N, int64_t K, float* y);
// An MXFP4 job; `layout` says how the codes and the scales lie (both kRowMajor, or both
// kMxfp4Lanes, which needs mxfp4_lanes_fit(N, K)).
MatmulJob mxfp4_job(const float* x, int64_t T, const uint8_t* packed, const uint8_t* scale,
                    int64_t N, int64_t K, float* y, Layout layout = Layout::kRowMajor);

// Rows [row0, row0 + rows) of a dense job (F32, BF16 or lane-packed BF16 weights; row0 a
// multiple of 64 for lane-packed ones) as a job of its own: the same arithmetic and bits for
// those rows, written where the whole job writes them.
MatmulJob job_rows(const MatmulJob& j, int64_t row0, int64_t rows);

// Bytes of one weight row of the job (MXFP4: packed values and scales), and of all the weights
// it reads (N rows, without a lane-packed matrix's padding; 0 when T = 0, which reads nothing).
int64_t job_row_bytes(const MatmulJob& j);
int64_t job_weight_bytes(const MatmulJob& j);

// Runs every job; the (job, row group) units lie on an axis of their cost (T * rows * K) that
// parallel_split cuts into one contiguous run per thread (balanced by stealing). Small batches
// run on the calling thread.
void matmul_batch(const MatmulJob* jobs, int64_t n_jobs);
// Scalar twin: each job's outputs in k order (matmul_ref / mxfp4_matmul_ref's arithmetic).
void matmul_batch_ref(const MatmulJob* jobs, int64_t n_jobs);

// Name of the Highway target the dispatched kernels run on here ("AVX3" = AVX-512, "AVX2",
// "SSE4", "SSSE3", "SCALAR"); chosen once from the CPU's features.
const char* matmul_simd_target();

}  // namespace attnres
