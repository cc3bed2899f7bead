// What `attnres bench` measures against (public API): the memory traffic of one decoded token
// and the machine's own read bandwidth, measured in the same run.
#pragma once

#include <cstdint>

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

struct MemoryBandwidth {
  double read_gb_s = 0, copy_gb_s = 0, triad_gb_s = 0;  // 1 GB = 1e9 bytes
  int threads = 0;
};
// A STREAM-style probe on the current thread count (src/kernels/stream_probe.h).
Result<MemoryBandwidth> measure_memory_bandwidth();

}  // namespace attnres
