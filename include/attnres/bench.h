// What `attnres bench` measures against (public API): the memory traffic of one decoded token
// and the machine's own read bandwidth, measured in the same run.
#pragma once

#include <cstdint>
#include <string>

#include "attnres/engine.h"

namespace attnres {

// Weight bytes one decoded token reads: every dense projection, the router, the shared
// experts and the top-k routed experts of each MoE layer, the norms and AttnRes queries,
// lm_head and one embedding row.
int64_t decode_weight_bytes_per_token(const Model& model);
// Recurrent-state and latent-cache bytes one decoded token reads and writes at context length
// `context`: each KDA layer reads and writes its fp32 state and conv windows; each MLA layer
// reads `context` cached latents and appends one (`cache_elem_bytes` per value).
int64_t decode_state_bytes_per_token(const Model& model, int64_t context, int64_t cache_elem_bytes);

// Weight bytes the attention cores read per decoding sequence on top of the projections:
// kv_b_proj of every MLA layer (the absorbed form's W_UK and W_UV products run per sequence).
int64_t decode_attention_weight_bytes_per_sequence(const Model& model);

// Floating-point operations per prompt token of a prefill over `prompt` tokens (a multiply-add
// is 2): every projection of the blocks (lm_head excluded: prefill scores only the last row),
// the top-k routed experts, MLA attention in its expanded form (the latents expanded by
// kv_b_proj, scores and values over the causal context, on average (prompt + 1) / 2 tokens) and
// the KDA recurrence counted as its four [dk, dv] matrix-vector products per head. Norms, gates,
// activations and AttnRes reads (linear in d) are left out.
double prefill_flops_per_token(const Model& model, int64_t prompt);

struct MemoryBandwidth {
  double read_gb_s = 0, copy_gb_s = 0, triad_gb_s = 0;  // 1 GB = 1e9 bytes
  int threads = 0;
};
// A STREAM-style probe on the current thread count (src/kernels/stream_probe.h).
Result<MemoryBandwidth> measure_memory_bandwidth();
// The mean read bandwidth of back-to-back read passes over `seconds` (the probe reports its
// best pass; this is what a sustained stream got at the time, src/kernels/stream_probe.h).
Result<double> measure_sustained_read(double seconds);

struct ComputePeak {
  double gflop_s = 0;       // a multiply-add is 2 FLOPs
  std::string instruction;  // what was timed: "vdpbf16ps" or the f32 FMA of the SIMD target
  int threads = 0;
};
// The arithmetic peak of the instruction prefill runs on (`bf16`: the bf16 flow, whose
// projections use vdpbf16ps where the CPU has AVX512_BF16), on the current thread count
// (src/kernels/compute_probe.h).
ComputePeak measure_compute_peak(bool bf16);

}  // namespace attnres
