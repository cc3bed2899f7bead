// Builds the forward program (program.h) from the layer schedule and computes its liveness
// lower bound.
#include <algorithm>
#include <cassert>

#include "plan/program.h"

namespace attnres {

std::string_view value_kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::kEmbedding:
      return "embedding";
    case ValueKind::kRunningSum:
      return "running_sum";
    case ValueKind::kCommitted:
      return "bank_slot";
    case ValueKind::kMixture:
      return "mixture";
    case ValueKind::kAttnOut:
      return "attn_out";
    case ValueKind::kMlpOut:
      return "mlp_out";
    case ValueKind::kFinal:
      return "final";
  }
  return "?";
}

std::string_view step_kind_name(StepKind k) {
  switch (k) {
    case StepKind::kEmbed:
      return "embed";
    case StepKind::kPreAttnRead:
      return "pre_attn";
    case StepKind::kAttention:
      return "attn";
    case StepKind::kPreMlpRead:
      return "pre_mlp";
    case StepKind::kMlp:
      return "mlp";
    case StepKind::kFinalRead:
      return "final";
  }
  return "?";
}

std::vector<int> Step::reads() const {
  std::vector<int> r = slot_sources;
  for (int v : {rs_in, pending, in}) {
    if (v >= 0) r.push_back(v);
  }
  // rs_out is defined here and read back (as the running-sum source): not an input.
  return r;
}

std::vector<int> Step::writes() const {
  std::vector<int> w;
  for (int v : {rs_out, commit, out}) {
    if (v >= 0) w.push_back(v);
  }
  return w;
}

int Program::step_index(int layer, StepKind kind) const {
  switch (kind) {
    case StepKind::kEmbed:
      return 0;
    case StepKind::kFinalRead:
      return static_cast<int>(steps.size()) - 1;
    case StepKind::kPreAttnRead:
      return 1 + 4 * layer;
    case StepKind::kAttention:
      return 2 + 4 * layer;
    case StepKind::kPreMlpRead:
      return 3 + 4 * layer;
    case StepKind::kMlp:
      return 4 + 4 * layer;
  }
  return -1;
}

std::string Program::step_name(int step) const {
  if (step == output_step()) return "output";
  if (step < 0 || step > output_step()) return "?";
  return steps[static_cast<size_t>(step)].name;
}

namespace {

class Builder {
 public:
  explicit Builder(Program& p) : p_(p) {}

  int value(ValueKind kind, int layer, std::string name, int slot = -1) {
    Value v;
    v.kind = kind;
    v.layer = layer;
    v.slot = slot;
    v.name = std::move(name);
    p_.values.push_back(std::move(v));
    return static_cast<int>(p_.values.size()) - 1;
  }

  int step(Step s) {
    const int id = static_cast<int>(p_.steps.size());
    for (int v : s.reads()) p_.values[static_cast<size_t>(v)].readers.push_back(id);
    // The new running sum is read back by its own step (it is a source of the read and the
    // commit copies it); recording that keeps "defined and consumed here" values visible.
    if (s.rs_out >= 0 && (s.commit >= 0 || s.out >= 0)) {
      p_.values[static_cast<size_t>(s.rs_out)].readers.push_back(id);
    }
    for (int v : s.writes()) p_.values[static_cast<size_t>(v)].def_step = id;
    p_.steps.push_back(std::move(s));
    return id;
  }

 private:
  Program& p_;
};

std::string lname(const char* what, int layer) {
  return std::string(what) + ".L" + std::to_string(layer);
}

}  // namespace

Program build_program(const LayerSchedule& schedule) {
  Program p;
  p.num_layers = schedule.num_layers();
  p.block_size = schedule.has_attnres() ? schedule.block_size : 0;
  p.bank_slots = schedule.has_attnres() ? schedule.bank_slots : 0;
  p.committed.assign(static_cast<size_t>(p.bank_slots), -1);
  Builder b(p);

  Step embed;
  embed.kind = StepKind::kEmbed;
  embed.name = "embed";
  embed.out = b.value(ValueKind::kEmbedding, -1, "embed");
  b.step(embed);

  int rs = embed.out;  // current running-sum value
  int pending = -1;    // sublayer output not yet folded in
  for (int i = 0; i < p.num_layers; ++i) {
    const LayerInfo& li = schedule.layers[static_cast<size_t>(i)];
    const std::string L = ".L" + std::to_string(i);
    const bool commits = p.has_attnres() && li.commit_slot.has_value();

    // Pre-attention read (at layer 0: the one-source read = input_layernorm(embedding)).
    Step ra;
    ra.kind = StepKind::kPreAttnRead;
    ra.layer = i;
    ra.name = "L" + std::to_string(i) + ".pre_attn";
    for (int k = 0; p.has_attnres() && k < p.bank_slots; ++k) {
      if (p.committed[static_cast<size_t>(k)] >= 0) ra.slot_sources.push_back(p.committed[k]);
    }
    ra.rs_in = rs;
    ra.pending = pending;
    if (pending >= 0) {
      ra.rs_out = b.value(ValueKind::kRunningSum, i, "rsum" + L + ".attn");
      rs = ra.rs_out;
    }
    if (commits) {
      const int k = *li.commit_slot;
      ra.commit_slot = k;
      ra.commit = b.value(ValueKind::kCommitted, i, "bank[" + std::to_string(k) + "]", k);
      p.committed[static_cast<size_t>(k)] = ra.commit;
    }
    ra.out = b.value(ValueKind::kMixture, i, lname("x", i) + ".attn");
    b.step(ra);
    assert(!p.has_attnres() ||
           static_cast<int>(ra.slot_sources.size()) + 1 == std::max(li.pre_attn_sources, 1));

    Step at;
    at.kind = StepKind::kAttention;
    at.layer = i;
    at.name = "L" + std::to_string(i) + ".attn";
    at.in = ra.out;
    at.out = b.value(ValueKind::kAttnOut, i, lname("attn_out", i));
    b.step(at);

    // Pre-MLP read. At a commit layer the block restarts: the attention output is the running
    // sum, so nothing is added.
    Step rm;
    rm.kind = StepKind::kPreMlpRead;
    rm.layer = i;
    rm.name = "L" + std::to_string(i) + ".pre_mlp";
    for (int k = 0; p.has_attnres() && k < p.bank_slots; ++k) {
      if (p.committed[static_cast<size_t>(k)] >= 0) rm.slot_sources.push_back(p.committed[k]);
    }
    if (commits) {
      rm.pending = at.out;
      rs = at.out;
    } else {
      rm.rs_in = rs;
      rm.pending = at.out;
      rm.rs_out = b.value(ValueKind::kRunningSum, i, "rsum" + L + ".mlp");
      rs = rm.rs_out;
    }
    rm.out = b.value(ValueKind::kMixture, i, lname("x", i) + ".mlp");
    b.step(rm);
    assert(!p.has_attnres() || static_cast<int>(rm.slot_sources.size()) + 1 == li.pre_mlp_sources);

    Step ml;
    ml.kind = StepKind::kMlp;
    ml.layer = i;
    ml.name = "L" + std::to_string(i) + ".mlp";
    ml.in = rm.out;
    ml.out = b.value(ValueKind::kMlpOut, i, lname("mlp_out", i));
    b.step(ml);
    pending = ml.out;
  }

  Step fin;
  fin.kind = StepKind::kFinalRead;
  fin.name = "final";
  for (int k = 0; k < p.bank_slots; ++k) fin.slot_sources.push_back(p.committed[k]);
  fin.rs_in = rs;
  fin.pending = pending;
  if (pending >= 0) fin.rs_out = b.value(ValueKind::kRunningSum, -1, "rsum.final");
  fin.out = b.value(ValueKind::kFinal, -1, "final");
  b.step(fin);
  p.final_value = fin.out;
  p.values[static_cast<size_t>(fin.out)].readers.push_back(p.output_step());
  return p;
}

int lower_bound_buffers(const Program& program) {
  const int S = program.output_step();
  // delta over step boundaries: live_after(s) = #{def <= s < last}, live_before(s) =
  // #{def < s <= last}.
  std::vector<int> after(static_cast<size_t>(S) + 1, 0), before(static_cast<size_t>(S) + 1, 0);
  for (const Value& v : program.values) {
    const int def = v.def_step, last = v.last_reader();
    if (last <= def) continue;  // born and consumed within one step: shares its copy's storage
    for (int s = def; s < last; ++s) ++after[static_cast<size_t>(s)];
    for (int s = def + 1; s <= last; ++s) ++before[static_cast<size_t>(s)];
  }
  int best = 0;
  for (int s = 0; s <= S; ++s) best = std::max({best, after[s], before[s]});
  return best;
}

}  // namespace attnres
