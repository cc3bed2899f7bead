// Model weights bound by their published names (k3-model.md §6), with or without the
// `language_model.` prefixes, checked against the config (dtype and shape).
//
// Residence (WeightResidence): by default every tensor the forward streams (projections,
// experts, the head, norms) is read from its file with pread into private memory advised as
// transparent huge pages (ModelWeights::private_memory); only what it looks up (an untied
// embedding, a step reads its tokens' rows) and factors folded at load stay views of the
// read-only file mapping. Measured on k3-mini, decode streams those copies about 1.6x faster
// than the same bytes through the mapping of page-cache pages (README, "Weights in memory").
// kMapped (--mmap) leaves every tensor a view of the mapping: zero copy, a faster start and a
// page cache shared between processes, except the sharded rows below and the projections.
//
// MXFP4 experts: codes and scales read into private memory (as above, or sharded) are stored
// in 16-row lane groups (util/mxfp4_lanes.h, TensorView::layout) where the rows fit them; in the
// mapping they stay row-major. The kernels compute the same bits from either.
//
// Projections: every BF16 matrix [N, K] (K even) that the forward reads only through projection
// jobs (attention and MLP projections, the router, shared, latent and dense experts, an untied
// lm_head) is read group by group into private memory in the lane-packed layout (util/lanes.h,
// TensorView::layout), whatever the residence, so the same bits come out of every load and
// every rank count (an output's bits depend only on its row and K). MLA's kv_b_proj (the scalar
// twins of the attention kernels read it row by row), the embedding and a tied head stay
// row-major; kv_b_proj's per-head blocks are copied once more, lane-packed, as the absorbed
// decode's projections (MlaWeights::w_uk_t, w_uv).
//
// Tensor parallelism (../shared/docs/parallel.md): loaded for rank r of P (a Shard), a sharded
// tensor is bound as this rank's contiguous rows only (its balanced share of the output rows, in
// whole heads where heads are split; TensorSpec::split says how). With P > 1 those rows are
// always read into private memory, never touched through the mapping, so a rank's resident
// weights are its rows of the sharded tensors plus the replicated ones (embedding, norms,
// AttnRes queries, the router's selection bias, KDA's f_a_proj and o_norm).
//
// Contract: load_model() validates the config and every safetensors header before touching any
// tensor data, binds every tensor the model needs (a missing tensor is an error naming it), and
// counts unused extra tensors (reported, not fatal); once a problem is found nothing more is
// read. The views point into read-only memory maps owned by ModelWeights::files or into
// ModelWeights::private_memory; they live as long as the ModelWeights.
// Thread-safety: immutable after load; safe to share between threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "util/memory.h"
#include "util/partition.h"
#include "util/status.h"
#include "util/tensor.h"

namespace attnres {

class SafetensorsFile;  // io/safetensors.h

// A [rows, cols] projection as stored (torch Linear layout: rows = out_features,
// cols = in_features), BF16 or F32, row-major: y = W x.
using Matrix = TensorView;

// A routed-expert projection [rows, cols] (rows: this rank's rows when sharded): MXFP4 (packed
// [rows, cols/2] U8 with the low nibble the even element; scale [rows, cols/32] U8 E8M0; both
// row-major or both in lane groups, as their layout says) or a dense BF16/F32 matrix.
struct ExpertMatrix {
  bool mxfp4 = false;
  int64_t rows = 0, cols = 0;
  TensorView packed;  // mxfp4
  TensorView scale;   // mxfp4
  Matrix dense;       // !mxfp4
  // mxfp4 in the lane layout (read into memory) with no scale byte 0 or 255
  // (mxfp4_scales_normal), checked once as it is loaded: its jobs' normal_scales.
  bool normal_scales = false;
};

struct KdaWeights {
  Matrix q_proj, k_proj, v_proj;      // [H*dk, d]
  TensorView q_conv, k_conv, v_conv;  // [H*dk, 1, W] F32 (depthwise causal conv)
  Matrix f_a_proj;                    // [dk, d]  forget-gate low rank
  Matrix f_b_proj;                    // [H*dk, dk]
  Matrix b_proj;                      // [H, d]   beta
  Matrix g_proj;                      // [H*dv, d] full-rank output gate (use_full_rank_gate)
  Matrix g_a_proj, g_b_proj;          // low-rank output gate otherwise: [dv, d], [H*dv, dv]
  std::vector<float> a_log;           // [H] per head (first H of [H], padded [>H] or [1,1,H,1])
  // Forget-gate channels that share one a_log entry: head_dim (A_log is per head). A test binds
  // a_log per channel (group 1) to show the golden data catch that misreading.
  int64_t a_log_group = 0;
  TensorView a_log_stored;  // A_log as stored (any of those shapes), for accounting
  TensorView dt_bias;       // [H*dk] F32
  TensorView o_norm;        // [dv] F32 gated RMSNorm gain
  Matrix o_proj;            // [d, H*dv]
};

struct MlaWeights {
  Matrix q_a_proj;       // [r_q, d]          (q_lora_rank > 0)
  TensorView q_a_norm;   // [r_q]
  Matrix q_b_proj;       // [H*(nope+rope), r_q]
  Matrix q_proj;         // [H*(nope+rope), d] (q_lora_rank == 0)
  Matrix kv_a_proj;      // [r_kv + rope, d]  -> c_kv | k_rot
  TensorView kv_a_norm;  // [r_kv]
  Matrix kv_b_proj;      // [H*(nope+v), r_kv] -> per head k_nope | v
  // kv_b_proj's heads as the absorbed form's projections (kernels/mla.h, MlaAbsorbedWeights),
  // one per head of this rank: W_UK[h]^T [r_kv, nope] and W_UV[h] [v, r_kv], lane-packed when
  // BF16 with an even row length, else row-major; private copies whatever the residence.
  std::vector<Matrix> w_uk_t, w_uv;
  Matrix g_proj;  // [H*v, d] sigmoid output gate (mla_use_output_gate), else empty
  Matrix o_proj;  // [d, H*v]
};

// W_UK[h]^T and W_UV[h] of each head of kv_b_proj [H*(nope+v), r] (BF16 or F32, row-major), as
// MlaWeights holds them, in `memory`; throws std::bad_alloc when it cannot allocate.
void absorbed_head_weights(const TensorView& kv_b_proj, int64_t nope, int64_t v,
                           WeightMemory& memory, std::vector<Matrix>& uk_t,
                           std::vector<Matrix>& uv);
// Bytes of the copies absorbed_head_weights() makes for `heads` heads of a kv_b_proj stored as
// `dtype` with latent rank r (lane-packed sizes where it packs).
int64_t absorbed_head_bytes(DType dtype, int64_t heads, int64_t nope, int64_t v, int64_t r);

struct ExpertWeights {
  ExpertMatrix w1;  // gate [I, K]
  ExpertMatrix w2;  // down [K, I]
  ExpertMatrix w3;  // up   [I, K]
};

struct MoeWeights {
  Matrix gate;           // router [E, d] (BF16)
  TensorView gate_bias;  // e_score_correction_bias [E] F32 (selection only)
  // false for every checkpoint: the bias selects experts, the combine weights are the unbiased
  // scores. A test sets it to show the golden data catch the bias misread as a weight.
  bool combine_with_bias = false;
  std::vector<ExpertWeights> experts;  // K = routed_expert_hidden_size (latent) or d
  Matrix shared_gate, shared_up;       // [S*I, d]
  Matrix shared_down;                  // [d, S*I]
  Matrix latent_down;                  // routed_expert_down_proj [r, d]  (latent MoE only)
  TensorView latent_norm;              // routed_expert_norm [r]          (latent_moe_use_norm)
  Matrix latent_up;                    // routed_expert_up_proj [d, r]
};

struct DenseMlpWeights {
  Matrix gate, up;  // [I, d]
  Matrix down;      // [d, I]
};

struct LayerWeights {
  TensorView input_norm;      // input_layernorm [d]
  TensorView post_attn_norm;  // post_attention_layernorm [d]
  // AttnRes queries folded once at load in fp32: res_norm.weight * res_proj.weight, [d].
  // Empty for plain-residual models.
  std::vector<float> attn_res_query;
  std::vector<float> mlp_res_query;
  // The stored factors of the queries ([d] and [1, d]), for accounting; empty without AttnRes.
  TensorView attn_res_norm, attn_res_proj, mlp_res_norm, mlp_res_proj;
  std::optional<KdaWeights> kda;
  std::optional<MlaWeights> mla;
  std::optional<MoeWeights> moe;
  std::optional<DenseMlpWeights> dense;
};

struct BindReport {
  int64_t tensors_in_files = 0;
  int64_t tensors_bound = 0;
  int64_t extra_tensors = 0;                       // present in the files, not used by the model
  std::vector<std::string> extra_examples;         // first few extra names
  std::map<std::string, int64_t> params_by_dtype;  // dtype name -> elements bound
  std::map<std::string, int64_t> bytes_by_dtype;   // dtype name -> bytes bound
  int64_t bytes_mapped = 0;
  int64_t bytes_private = 0;  // read into ModelWeights::private_memory
  // This rank's weights: the bytes of the views it binds (its rows of every sharded tensor plus
  // every replicated tensor), and of the replicated ones alone. Equal to the bound total at P = 1.
  int64_t rank_bytes = 0;
  int64_t rank_replicated_bytes = 0;
  // Copies this rank derives from its views at load, in private memory beside them: MLA's
  // per-head absorbed projections (absorbed_head_bytes).
  int64_t rank_copy_bytes = 0;
};

struct ModelWeights {
  ModelConfig config;
  Shard shard;                            // the rank these views were bound for
  TensorView embed;                       // [V, d]
  TensorView final_norm;                  // [d]
  TensorView lm_head;                     // [V, d] (embed when tied)
  std::vector<float> out_res_query;       // output_attn_res_norm * output_attn_res_proj, [d]
  TensorView out_res_norm, out_res_proj;  // the stored factors, for accounting
  std::vector<LayerWeights> layers;
  BindReport report;
  std::vector<std::shared_ptr<const SafetensorsFile>> files;
  // The tensors (sharded: this rank's rows) read from the files into private memory (see the
  // file comment); shared by copies of this ModelWeights.
  std::shared_ptr<WeightMemory> private_memory;
};

// A tensor the model needs, by canonical name (no `language_model.`/`model.` prefix; the
// release spells them `language_model.model.<name>` and `language_model.lm_head.weight`).
// `u8` = MXFP4 packed codes or E8M0 scales; otherwise BF16 or F32. `shape` is the canonical
// shape (A_log [H], *_res_proj [1, d]); the binder also accepts the documented variants.
struct TensorSpec {
  std::string name;
  bool u8 = false;
  std::vector<int64_t> shape;
  // Tensor parallelism: the first dimension is split over the ranks in `split_units` units of
  // `unit_rows` rows each (heads of a head dimension, single rows otherwise); 0: replicated.
  int64_t split_units = 0;
  int64_t unit_rows = 0;
};

// The storage dtype of a tensor in the published checkpoint (k3-model.md §5): U8 for MXFP4
// codes and scales, F32 for the conv weights, A_log, dt_bias, o_norm and the router's selection
// bias, BF16 for everything else.
DType release_dtype(const std::string& canonical_name);
// Bytes of rank `shard.rank`'s share of a tensor of `spec` stored as `dtype` (all of it when
// replicated).
int64_t shard_tensor_bytes(const TensorSpec& spec, DType dtype, const Shard& shard);

// Rows [row0, row0 + rows) of a view (its first dimension).
TensorView slice_rows(const TensorView& v, int64_t row0, int64_t rows);

// Every tensor load_model() binds for `config`, in binding order. The binder itself produces
// the list, so a checkpoint written from it binds with nothing missing.
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& config);

// Where the streamed weights live (see the file comment).
enum class WeightResidence {
  kPrivate,  // read into private memory (the default)
  kMapped,   // views of the file mapping (sharded rows at P > 1 are still read)
};

// Loads `model_dir/config.json` and binds the tensors of `model.safetensors` or of the shards
// listed in `model.safetensors.index.json`, as rank `shard.rank` of `shard.ranks` (its rows of
// every sharded tensor; see the file comment).
Result<ModelWeights> load_model(const std::string& model_dir, const Shard& shard = {},
                                WeightResidence residence = WeightResidence::kPrivate);

// Every file a load of `model_dir` read: config.json, the shard index (when there is one) and
// the weight files of `weights`. The inputs an output must never replace (io/output.h).
std::vector<std::string> model_input_files(const ModelWeights& weights,
                                           const std::string& model_dir);

}  // namespace attnres
