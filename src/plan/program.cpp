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

// "L<layer>.<what>" (appended piece by piece: GCC 12 warns falsely on the chained operator+).
std::string step_label(int layer, const char* what) {
  std::string s = "L";
  s += std::to_string(layer);
  s += '.';
  s += what;
  return s;
}

}  // namespace

namespace {

// The forward program of one step, built layer by layer (k3-model.md §2, HF order). The running
// state of the build is the current running-sum value and the sublayer output not yet folded
// into it (the delayed add).
class ForwardBuilder {
 public:
  ForwardBuilder(Program& p, const LayerSchedule& s) : p_(p), s_(s), b_(p) {}

  void embed() {
    Step e;
    e.kind = StepKind::kEmbed;
    e.name = "embed";
    e.out = b_.value(ValueKind::kEmbedding, -1, "embed");
    b_.step(e);
    rs_ = e.out;
  }

  // Layer i: read, attention, read, MLP.
  void layer(int i) {
    const LayerInfo& li = s_.layers[static_cast<size_t>(i)];
    const bool commits = p_.has_attnres() && li.commit_slot.has_value();
    const int x_attn = pre_attention_read(i, commits ? *li.commit_slot : -1);
    assert(!p_.has_attnres() || static_cast<int>(p_.steps.back().slot_sources.size()) + 1 ==
                                    std::max(li.pre_attn_sources, 1));
    const int attn_out = sublayer(StepKind::kAttention, i, x_attn, ValueKind::kAttnOut, "attn");
    const int x_mlp = pre_mlp_read(i, attn_out, commits);
    assert(!p_.has_attnres() ||
           static_cast<int>(p_.steps.back().slot_sources.size()) + 1 == li.pre_mlp_sources);
    pending_ = sublayer(StepKind::kMlp, i, x_mlp, ValueKind::kMlpOut, "mlp");
  }

  // The output mixture over the whole bank and the last running sum, then the final norm.
  void final_read() {
    Step f;
    f.kind = StepKind::kFinalRead;
    f.name = "final";
    for (int k = 0; k < p_.bank_slots; ++k) f.slot_sources.push_back(p_.committed[k]);
    f.rs_in = rs_;
    f.pending = pending_;
    if (pending_ >= 0) f.rs_out = b_.value(ValueKind::kRunningSum, -1, "rsum.final");
    f.out = b_.value(ValueKind::kFinal, -1, "final");
    b_.step(f);
    p_.final_value = f.out;
    p_.values[static_cast<size_t>(f.out)].readers.push_back(p_.output_step());
  }

 private:
  // Every slot committed so far, in slot order.
  std::vector<int> bank() const {
    std::vector<int> v;
    for (int k = 0; p_.has_attnres() && k < p_.bank_slots; ++k)
      if (p_.committed[static_cast<size_t>(k)] >= 0) v.push_back(p_.committed[k]);
    return v;
  }

  // The delayed add of the previous MLP output, the commit of slot `commit_slot` (>= 0 at a
  // block start: the bank gets the block's final running sum), then the read and
  // input_layernorm. At layer 0 the read has the embedding as its only source.
  int pre_attention_read(int i, int commit_slot) {
    Step r;
    r.kind = StepKind::kPreAttnRead;
    r.layer = i;
    r.name = step_label(i, "pre_attn");
    r.slot_sources = bank();
    r.rs_in = rs_;
    r.pending = pending_;
    if (pending_ >= 0)
      rs_ = r.rs_out = b_.value(ValueKind::kRunningSum, i, lname("rsum", i) + ".attn");
    if (commit_slot >= 0) {
      r.commit_slot = commit_slot;
      r.commit = b_.value(ValueKind::kCommitted, i, "bank[" + std::to_string(commit_slot) + "]",
                          commit_slot);
      p_.committed[static_cast<size_t>(commit_slot)] = r.commit;
    }
    r.out = b_.value(ValueKind::kMixture, i, lname("x", i) + ".attn");
    b_.step(r);
    return r.out;
  }

  // Folds the attention output into the running sum (at a commit layer the block restarts: the
  // attention output is the running sum, nothing is added), then the read and
  // post_attention_layernorm.
  int pre_mlp_read(int i, int attn_out, bool commits) {
    Step r;
    r.kind = StepKind::kPreMlpRead;
    r.layer = i;
    r.name = step_label(i, "pre_mlp");
    r.slot_sources = bank();
    r.pending = attn_out;
    if (commits) {
      rs_ = attn_out;
    } else {
      r.rs_in = rs_;
      rs_ = r.rs_out = b_.value(ValueKind::kRunningSum, i, lname("rsum", i) + ".mlp");
    }
    r.out = b_.value(ValueKind::kMixture, i, lname("x", i) + ".mlp");
    b_.step(r);
    pending_ = -1;
    return r.out;
  }

  int sublayer(StepKind kind, int i, int in, ValueKind out_kind, const char* what) {
    Step s;
    s.kind = kind;
    s.layer = i;
    s.name = step_label(i, what);
    s.in = in;
    s.out = b_.value(out_kind, i, lname(kind == StepKind::kAttention ? "attn_out" : "mlp_out", i));
    b_.step(s);
    return s.out;
  }

  Program& p_;
  const LayerSchedule& s_;
  Builder b_;
  int rs_ = -1;       // current running-sum value
  int pending_ = -1;  // sublayer output not yet folded in
};

}  // namespace

Program build_program(const LayerSchedule& schedule) {
  Program p;
  p.num_layers = schedule.num_layers();
  p.block_size = schedule.has_attnres() ? schedule.block_size : 0;
  p.bank_slots = schedule.has_attnres() ? schedule.bank_slots : 0;
  p.committed.assign(static_cast<size_t>(p.bank_slots), -1);
  ForwardBuilder f(p, schedule);
  f.embed();
  for (int i = 0; i < p.num_layers; ++i) f.layer(i);
  f.final_read();
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
