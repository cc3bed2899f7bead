// What tensor parallelism costs for a config, computed from the config alone (no weights):
// each rank's weight bytes (from the binder's own tensor list and split rules, so it is what a
// rank binds; tests compare it with load_model) and the copies it makes of them, the weights it
// reads per decoded token, its KDA state per sequence, and the gathers one decoded token makes
// (counted the way the blocks make them; tests compare the count with a run). For `attnres plan
// --ranks`.
#pragma once

#include <cstdint>
#include <vector>

#include "config/config.h"

namespace attnres {

struct TpRankPlan {
  int rank = 0;
  int64_t weight_bytes = 0;      // its rows of every sharded tensor + every replicated tensor
  int64_t replicated_bytes = 0;  // the replicated tensors alone
  // Copies it derives at load beside weight_bytes (BindReport::rank_copy_bytes): MLA's per-head
  // absorbed projections of its heads.
  int64_t copy_bytes = 0;
  // Weights one decoded token reads on this rank: its rows of every dense matrix and of the
  // top-k routed experts (k/E of each expert tensor), the replicated norms and queries, one
  // embedding row.
  int64_t read_bytes_per_token = 0;
  int64_t kda_state_bytes = 0;  // its heads' KDA states of one sequence (every KDA layer)
};

std::vector<TpRankPlan> tp_rank_plans(const ModelConfig& config, int ranks);

struct TpTraffic {
  int64_t gathers = 0;       // all-gathers per decoded token (fused ones once)
  int64_t gather_bytes = 0;  // bytes of the gathered results per decoded token
  int64_t control = 0;       // the leader's step broadcast
  // Per kind of sublayer: gathers of one layer.
  int kda = 0, mla = 0, moe = 0, dense = 0, lm_head = 0;
};

// One decoded token of one sequence (a step of one row) on `ranks` ranks; bf16: the bf16 flow
// (values travel as bf16 except the router's f32 scores).
TpTraffic tp_decode_traffic(const ModelConfig& config, int ranks, bool bf16);

}  // namespace attnres
