// Decode traffic and the bandwidth probe (include/attnres/bench.h).
#include "attnres/bench.h"

#include "io/weights.h"
#include "kernels/compute_probe.h"
#include "kernels/stream_probe.h"

namespace attnres {
namespace {

int64_t view_bytes(const TensorView& t) {
  return static_cast<int64_t>(t.nbytes);
}
int64_t matrix_bytes(const ExpertMatrix& m) {
  return m.mxfp4 ? view_bytes(m.packed) + view_bytes(m.scale) : view_bytes(m.dense);
}

// Weight bytes one decoded token reads (see the file comment).
int64_t weight_bytes(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  int64_t b = view_bytes(w.lm_head) + view_bytes(w.final_norm);
  b += c.hidden_size * static_cast<int64_t>(dtype_size(w.embed.dtype));  // one embedding row
  b += static_cast<int64_t>(w.out_res_query.size() * sizeof(float));
  for (const LayerWeights& l : w.layers) {
    b += view_bytes(l.input_norm) + view_bytes(l.post_attn_norm);
    b += static_cast<int64_t>((l.attn_res_query.size() + l.mlp_res_query.size()) * sizeof(float));
    if (l.kda) {
      const KdaWeights& k = *l.kda;
      for (const TensorView* t : {&k.q_proj, &k.k_proj, &k.v_proj, &k.q_conv, &k.k_conv, &k.v_conv,
                                  &k.f_a_proj, &k.f_b_proj, &k.b_proj, &k.g_proj, &k.g_a_proj,
                                  &k.g_b_proj, &k.dt_bias, &k.o_norm, &k.o_proj})
        b += view_bytes(*t);
    }
    if (l.mla) {
      const MlaWeights& m = *l.mla;
      for (const TensorView* t : {&m.q_a_proj, &m.q_a_norm, &m.q_b_proj, &m.q_proj, &m.kv_a_proj,
                                  &m.kv_a_norm, &m.kv_b_proj, &m.g_proj, &m.o_proj})
        b += view_bytes(*t);
    }
    if (l.dense)
      b += view_bytes(l.dense->gate) + view_bytes(l.dense->up) + view_bytes(l.dense->down);
    if (l.moe) {
      const MoeWeights& m = *l.moe;
      for (const TensorView* t : {&m.gate, &m.gate_bias, &m.shared_gate, &m.shared_up,
                                  &m.shared_down, &m.latent_down, &m.latent_norm, &m.latent_up})
        b += view_bytes(*t);
      if (!m.experts.empty()) {
        const ExpertWeights& e = m.experts.front();  // all experts have the same size
        b += c.num_experts_per_token *
             (matrix_bytes(e.w1) + matrix_bytes(e.w2) + matrix_bytes(e.w3));
      }
    }
  }
  return b;
}

// Recurrent-state and latent-cache bytes one decoded token reads and writes at context length
// `ctx`: each KDA layer reads and writes its fp32 state [H, dk, dv] and conv state; each MLA
// layer reads ctx cached latents [kv_lora + rope] and appends one.
int64_t state_bytes(const ModelConfig& c, int64_t ctx, int64_t cache_elem_bytes) {
  const int64_t H = c.linear.num_heads, dk = c.linear.head_dim;
  const int64_t kda_state =
      H * dk * dk * 4 + 3 * H * dk * (c.linear.short_conv_kernel_size - 1) * 4;
  const int64_t mla_row = (c.kv_lora_rank + c.qk_rope_head_dim) * cache_elem_bytes;
  return c.schedule.num_kda * 2 * kda_state + c.schedule.num_mla * (ctx + 1) * mla_row;
}

}  // namespace

int64_t decode_weight_bytes_per_token(const Model& model) {
  return weight_bytes(model.weights());
}

int64_t decode_state_bytes_per_token(const Model& model, int64_t context,
                                     int64_t cache_elem_bytes) {
  return state_bytes(model.weights().config, context, cache_elem_bytes);
}

int64_t decode_attention_weight_bytes_per_sequence(const Model& model) {
  int64_t b = 0;
  for (const LayerWeights& l : model.weights().layers)
    if (l.mla) b += view_bytes(l.mla->kv_b_proj);
  return b;
}

double prefill_flops_per_token(const Model& model, int64_t prompt) {
  const ModelWeights& w = model.weights();
  const ModelConfig& c = w.config;
  auto mat = [](const TensorView& t) { return t.data ? static_cast<double>(t.numel()) : 0.0; };
  auto expert = [](const ExpertMatrix& m) { return static_cast<double>(m.rows * m.cols); };
  const double ctx = (static_cast<double>(prompt) + 1) / 2;
  double macs = 0;
  for (const LayerWeights& l : w.layers) {
    if (l.kda) {
      const KdaWeights& k = *l.kda;
      for (const TensorView* t : {&k.q_proj, &k.k_proj, &k.v_proj, &k.f_a_proj, &k.f_b_proj,
                                  &k.b_proj, &k.g_proj, &k.g_a_proj, &k.g_b_proj, &k.o_proj})
        macs += mat(*t);
      const double dk = static_cast<double>(c.linear.head_dim);
      macs += 4 * c.linear.num_heads * dk * dk;
    }
    if (l.mla) {
      const MlaWeights& m = *l.mla;
      for (const TensorView* t :
           {&m.q_a_proj, &m.q_b_proj, &m.q_proj, &m.kv_a_proj, &m.kv_b_proj, &m.g_proj, &m.o_proj})
        macs += mat(*t);
      const double H = static_cast<double>(c.num_attention_heads);
      macs += H * ctx * static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim);
    }
    if (l.dense) macs += mat(l.dense->gate) + mat(l.dense->up) + mat(l.dense->down);
    if (l.moe) {
      const MoeWeights& m = *l.moe;
      for (const TensorView* t :
           {&m.gate, &m.shared_gate, &m.shared_up, &m.shared_down, &m.latent_down, &m.latent_up})
        macs += mat(*t);
      if (!m.experts.empty()) {
        const ExpertWeights& e = m.experts.front();
        macs += static_cast<double>(c.num_experts_per_token) *
                (expert(e.w1) + expert(e.w2) + expert(e.w3));
      }
    }
  }
  return 2 * macs;
}

ComputePeak measure_compute_peak(bool bf16) {
  const ComputeProbeResult k = compute_probe(bf16, 5);
  return ComputePeak{k.gflop_s, k.instruction, k.threads};
}

Result<MemoryBandwidth> measure_memory_bandwidth() {
  ATTNRES_ASSIGN_OR_RETURN(StreamResult r, stream_probe());
  MemoryBandwidth b;
  b.read_gb_s = r.read_gb_s;
  b.copy_gb_s = r.copy_gb_s;
  b.triad_gb_s = r.triad_gb_s;
  b.threads = r.threads;
  return b;
}

Result<double> measure_sustained_read(double seconds) {
  return sustained_read_gb_s(seconds);
}

}  // namespace attnres
