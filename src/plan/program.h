// The forward step as a program over values (k3-model.md §2, HF order), the input of every
// storage policy, of the verifier and of the executor.
//
// Values: the embedding, every version of the running sum, every committed bank slot, every
// normalised sublayer input ("mixture": the AttnRes read followed by the RMSNorm), every
// sublayer output and the final normalised hidden state. Each value is defined by exactly one
// step and read by a known list of steps (in step order); the final hidden state is read by the
// caller (the pseudo-step `output_step()`).
//
// Steps, in order: embed; then per layer i: pre-attention read, attention, pre-MLP read, MLP;
// then the final read. A read step is one fused AttnRes operation (kernels/attnres.h):
//   running_sum' = bf16(running_sum + pending)   (the delayed add; absent when either is absent)
//   bank[k] = running_sum'                       (commit, at the pre-attention read of i % B == 0)
//   out = rmsnorm(read(q, bank ++ [running_sum'])) * gain
// Its writes happen in the order rs_out, commit, out, each per token row after every read of
// that row. At layer 0 the pre-attention "read" has one source (the embedding) and is therefore
// exactly input_layernorm(embedding), which is HF's skipped read. At a commit layer the pre-MLP
// read sees the attention output itself as the running sum (the block restarts), so no new
// running-sum value is defined there. A plain-residual model (block_size 0) is the same program
// without bank: every read has the running sum as its only source, so it is h += pending;
// out = norm(h).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"

namespace attnres {

enum class ValueKind {
  kEmbedding,   // the embedding (also the first running-sum version)
  kRunningSum,  // running sum after a delayed add
  kCommitted,   // bank slot k (a copy of the block's final running sum)
  kMixture,     // normalised sublayer input (AttnRes read + RMSNorm)
  kAttnOut,     // self_attn output (at a commit layer also the restarted running sum)
  kMlpOut,      // FFN output
  kFinal,       // final normalised hidden state (input of lm_head)
};
std::string_view value_kind_name(ValueKind k);

enum class StepKind { kEmbed, kPreAttnRead, kAttention, kPreMlpRead, kMlp, kFinalRead };
std::string_view step_kind_name(StepKind k);  // "embed", "pre_attn", "attn", ...

struct Value {
  ValueKind kind = ValueKind::kEmbedding;
  int layer = -1;  // defining layer; -1 for the embedding and the final read
  int slot = -1;   // bank slot for kCommitted
  std::string name;
  int def_step = -1;
  std::vector<int> readers;  // steps that read it, ascending; output_step() for kFinal
  int last_reader() const { return readers.empty() ? def_step : readers.back(); }
};

struct Step {
  StepKind kind = StepKind::kEmbed;
  int layer = -1;  // -1 for embed and final
  std::string name;
  // Read steps (kPreAttnRead, kPreMlpRead, kFinalRead); -1 = absent.
  std::vector<int> slot_sources;  // committed slot values read, in slot order
  int rs_in = -1;                 // running sum before the delayed add
  int pending = -1;               // sublayer output folded into the running sum
  int rs_out = -1;                // new running-sum version (only when rs_in and pending exist)
  int commit = -1;                // committed slot value defined here
  int commit_slot = -1;
  // Every step: the value it writes last (mixture, sublayer output, embedding, final).
  int out = -1;
  // Sublayer steps: their input (a mixture).
  int in = -1;

  bool is_read() const {
    return kind == StepKind::kPreAttnRead || kind == StepKind::kPreMlpRead ||
           kind == StepKind::kFinalRead;
  }
  // The running-sum source of a read: rs_out, else whichever of rs_in / pending exists.
  int rs_source() const { return rs_out >= 0 ? rs_out : (rs_in >= 0 ? rs_in : pending); }
  std::vector<int> reads() const;   // every value read (inputs), no duplicates
  std::vector<int> writes() const;  // values defined, in write order
};

struct Program {
  int num_layers = 0;
  int block_size = 0;  // 0 = plain residual
  int bank_slots = 0;
  std::vector<Value> values;
  std::vector<Step> steps;
  std::vector<int> committed;  // committed[k] = value id of bank slot k
  int final_value = -1;

  bool has_attnres() const { return block_size > 0; }
  int output_step() const { return static_cast<int>(steps.size()); }
  // The step index of (layer, kind).
  int step_index(int layer, StepKind kind) const;
  // "L84.pre_mlp", "final", "output" (for output_step()).
  std::string step_name(int step) const;
};

// Builds the program from the AttnRes schedule (attnres_schedule or ModelConfig::schedule).
Program build_program(const LayerSchedule& schedule);

// The liveness lower bound on [T, d] buffers: the most values that must coexist, i.e. the
// maximum over steps of max(live before the step's writes, live after them), where a value is
// live from its defining step to its last reader. A value born and consumed within one step (the
// block's final running sum at a commit) is not counted: it shares storage with its committed
// copy, which is the same data.
int lower_bound_buffers(const Program& program);

}  // namespace attnres
