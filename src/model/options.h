// Forward options: activation dtype flow, MLA cache dtype, kernel-form choices, and the
// projection-time instrumentation `attnres bench` reads.
#pragma once

#include <cstdint>
#include <string_view>

#include "plan/executor.h"  // ActDType (the activation storage type the executor also uses)

namespace attnres {

class TensorParallel;  // parallel/gather.h

// Activation dtype flow (ActDType, plan/executor.h):
// f32: weights as stored, widened; every activation f32 (what the golden data use).
// bf16: the official bf16 dtype flow. Values are rounded to bf16 where the bf16 HF model holds
// bf16 tensors: projection outputs, RMSNorm outputs, conv/SiLU outputs, attention outputs, the
// SiTU output, the AttnRes mixture, and the running sum / residual after every add. Scores,
// softmax, the KDA gate and state, the router and the MoE combine accumulate in f32.
// MLA latent cache storage. kAuto = f32 for f32 activations, bf16 for bf16 activations.
enum class KvCacheDtype { kAuto, kF32, kBF16, kFP8 };

std::string_view kv_cache_dtype_name(KvCacheDtype d);

// Wall time and weight bytes of the projection batches the blocks and lm_head issue (every
// nn.Linear and expert matrix, except kv_b_proj's per-head products inside MLA's absorbed
// attention, which count as attention), split by the weights they stream: a batch with an
// MXFP4 job counts as MXFP4 (the routed experts), any other as dense.
struct ProjectionStats {
  double dense_seconds = 0, mxfp4_seconds = 0;
  int64_t dense_bytes = 0, mxfp4_bytes = 0;
  double dense_flops = 0, mxfp4_flops = 0;  // 2 x rows x weight elements of each job
  int64_t batches = 0;
};

struct ForwardOptions {
  ActDType act = ActDType::kBF16;
  KvCacheDtype kv = KvCacheDtype::kAuto;
  int64_t kda_chunk = 64;      // WY/UT chunk length for multi-token KDA steps
  bool kda_recurrent = false;  // force the recurrent KDA form for every step (reference)
  bool mla_absorbed = false;   // force the absorbed MLA form for every step
  // When set, projection batches add their wall time and weight bytes here.
  ProjectionStats* projection_stats = nullptr;
  // Tensor parallelism: this rank's communicator and gather state; null = one rank. The
  // weights must have been bound for the same rank and rank count (ModelWeights::shard).
  TensorParallel* tp = nullptr;

  bool bf16() const { return act == ActDType::kBF16; }
  KvCacheDtype cache_dtype() const {
    if (kv != KvCacheDtype::kAuto) return kv;
    return act == ActDType::kF32 ? KvCacheDtype::kF32 : KvCacheDtype::kBF16;
  }
};

}  // namespace attnres
