// The four storage policies (plan.h). Each is a pure function of the program; the verifier
// (verify.cpp) checks their output independently.
#include <algorithm>
#include <cassert>
#include <limits>

#include "plan/plan.h"

namespace attnres {

std::string_view policy_name(Policy p) {
  switch (p) {
    case Policy::kSeparate:
      return "separate";
    case Policy::kUnrestricted:
      return "unrestricted";
    case Policy::kPreserveFinal:
      return "preserve-final";
    case Policy::kPlanned:
      return "planned";
  }
  return "?";
}

std::optional<Policy> parse_policy(std::string_view name) {
  for (Policy p : kAllPolicies) {
    if (policy_name(p) == name) return p;
  }
  return std::nullopt;
}

namespace {

// A plan with the bank slots as storages 0..S-1.
Plan plan_with_bank(const Program& prog, Policy policy) {
  Plan plan;
  plan.policy = policy;
  for (int k = 0; k < prog.bank_slots; ++k)
    plan.storages.push_back({"slot" + std::to_string(k), k});
  plan.storage_of.assign(prog.values.size(), -1);
  return plan;
}

int add_buffer(Plan& plan) {
  int n = 0;
  for (const Storage& s : plan.storages) n += s.bank_slot < 0 ? 1 : 0;
  plan.storages.push_back({"buf" + std::to_string(n), -1});
  return plan.num_storages() - 1;
}

const Value& val(const Program& p, int v) {
  return p.values[static_cast<size_t>(v)];
}

// Rules 1..8 of attnres-storage.md ("unrestricted reuse"); with `preserve_final` the published
// fix: the post-attention mixture of the layer that commits the last slot gets fresh storage.
Plan unrestricted_plan(const Program& prog, Policy policy, bool preserve_final) {
  Plan plan = plan_with_bank(prog, policy);  // rule 1: the bank is retained, slot k = [T, d]
  auto at = [&](int v, int storage) { plan.storage_of[static_cast<size_t>(v)] = storage; };
  auto st = [&](int v) { return plan.storage_of[static_cast<size_t>(v)]; };
  const int hidden = add_buffer(plan);  // the embedding / hidden-states buffer
  const int last_commit_layer = prog.bank_slots > 0 ? (prog.bank_slots - 1) * prog.block_size : -1;
  for (const Step& s : prog.steps) {
    switch (s.kind) {
      case StepKind::kEmbed:
        at(s.out, hidden);
        break;
      case StepKind::kAttention:
      case StepKind::kMlp:
        at(s.out, st(s.in));  // rule 3: a sublayer writes over its own input
        break;
      case StepKind::kPreAttnRead:
        if (s.rs_out >= 0) at(s.rs_out, st(s.rs_in));    // rule 4: in-place delayed add
        if (s.commit >= 0) at(s.commit, s.commit_slot);  // rule 7: copy (no-op if same storage)
        if (s.layer == 0) {
          // Rule 2: the first normalised input goes into the last slot as scratch (slot 7 of
          // the published model). A plain-residual model has no bank: a scratch buffer.
          at(s.out, prog.bank_slots > 0 ? prog.bank_slots - 1 : add_buffer(plan));
        } else {
          at(s.out, st(s.pending));  // rule 5: into the consumed pending output
        }
        break;
      case StepKind::kPreMlpRead:
        if (s.rs_out >= 0) {
          at(s.rs_out, st(s.rs_in));  // rule 4
          at(s.out, st(s.pending));   // rule 6: into the consumed attention output
        } else if (preserve_final && s.layer == last_commit_layer) {
          at(s.out, add_buffer(plan));  // the published fix
        } else {
          // Rule 6 at a commit layer: into the old running sum (it was just committed, so it
          // looks dead); the attention output's storage became the running sum (rule 4).
          const Step& pre =
              prog.steps[static_cast<size_t>(prog.step_index(s.layer, StepKind::kPreAttnRead))];
          at(s.out, st(pre.rs_source()));
        }
        break;
      case StepKind::kFinalRead:
        if (s.rs_out >= 0) at(s.rs_out, st(s.rs_in));
        at(s.out, st(s.pending >= 0 ? s.pending : s.rs_in));  // rule 8: into the last MLP output
        break;
    }
  }
  return plan;
}

// Fresh storage per value, released after its last reader has run; committed slots in their
// bank slot.
Plan separate_plan(const Program& prog) {
  Plan plan = plan_with_bank(prog, Policy::kSeparate);
  std::vector<int> free_buffers;                                       // sorted ascending
  std::vector<std::vector<int>> release_after(prog.steps.size() + 1);  // storages per step
  for (size_t si = 0; si < prog.steps.size(); ++si) {
    const Step& s = prog.steps[si];
    for (int v : s.writes()) {
      int storage;
      if (val(prog, v).kind == ValueKind::kCommitted) {
        storage = val(prog, v).slot;
      } else if (!free_buffers.empty()) {
        storage = free_buffers.front();
        free_buffers.erase(free_buffers.begin());
      } else {
        storage = add_buffer(plan);
      }
      plan.storage_of[static_cast<size_t>(v)] = storage;
      if (val(prog, v).kind != ValueKind::kCommitted) {
        release_after[static_cast<size_t>(val(prog, v).last_reader())].push_back(storage);
      }
    }
    for (int storage : release_after[si]) {
      free_buffers.insert(std::upper_bound(free_buffers.begin(), free_buffers.end(), storage),
                          storage);
    }
  }
  return plan;
}

// Liveness: reuse storage whose current value has no later reader. The embedding and block 0's
// commit live in slot 0; the running sum of block k (from the attention output that restarts it
// to its commit) and the committed slot k+1 live in slot k+1, so commits copy nothing. Every
// other value takes, in order of preference, the storage of an input of its own step that dies
// there (in place), a free storage (a not-yet-committed slot only when its value dies before the
// slot is needed), or a new buffer. Tests check that the result meets lower_bound_buffers().
Plan planned_plan(const Program& prog) {
  Plan plan = plan_with_bank(prog, Policy::kPlanned);
  const int nv = static_cast<int>(prog.values.size());
  std::vector<int> fixed(static_cast<size_t>(nv), -1);
  if (prog.has_attnres()) {
    fixed[static_cast<size_t>(prog.steps.front().out)] = 0;  // the embedding -> slot 0
    for (const Step& s : prog.steps) {
      if (s.commit >= 0) {
        fixed[static_cast<size_t>(s.commit)] = s.commit_slot;
        // The running sum committed here (and every version of it back to the block's
        // restart) was placed in this slot: see the walk below.
      }
    }
    // Walk each block's running-sum chain backwards from its commit.
    for (const Step& s : prog.steps) {
      if (s.commit < 0 || s.layer == 0) continue;
      int v = s.rs_source();
      while (v >= 0) {
        fixed[static_cast<size_t>(v)] = s.commit_slot;
        const Value& vv = val(prog, v);
        if (vv.kind != ValueKind::kRunningSum) break;  // reached the restarting attention output
        v = prog.steps[static_cast<size_t>(vv.def_step)].rs_in;
      }
    }
  }
  // Reservation of each storage: def steps of the values fixed to it.
  std::vector<std::vector<int>> reserved(static_cast<size_t>(prog.bank_slots));
  for (int v = 0; v < nv; ++v) {
    if (fixed[static_cast<size_t>(v)] >= 0) {
      reserved[static_cast<size_t>(fixed[static_cast<size_t>(v)])].push_back(val(prog, v).def_step);
    }
  }
  auto next_reservation = [&](int storage, int step) {
    if (storage >= prog.bank_slots) return std::numeric_limits<int>::max();
    int best = std::numeric_limits<int>::max();
    for (int d : reserved[static_cast<size_t>(storage)]) {
      if (d >= step) best = std::min(best, d);
    }
    return best;
  };

  std::vector<int> cur;  // current value per storage, -1 = empty
  cur.assign(static_cast<size_t>(plan.num_storages()), -1);
  for (size_t si = 0; si < prog.steps.size(); ++si) {
    const int step = static_cast<int>(si);
    const Step& s = prog.steps[si];
    // In-place candidates, running sum and pending first; the bank slots read here last.
    std::vector<int> ins;
    for (int v : {s.rs_in, s.pending, s.in}) {
      if (v >= 0) ins.push_back(v);
    }
    ins.insert(ins.end(), s.slot_sources.begin(), s.slot_sources.end());
    for (int v : s.writes()) {
      const int last = val(prog, v).last_reader();
      // rs_out and the commit are written in pass 1, before the step reads its bank slots.
      const bool before_slot_reads = v != s.out;
      int chosen = fixed[static_cast<size_t>(v)];
      if (chosen < 0) {
        auto usable = [&](int p) {
          const int w = cur[static_cast<size_t>(p)];
          if (w >= 0 && (w == v || val(prog, w).last_reader() > step)) return false;
          // Written earlier in this step (e.g. the new running sum, read back): not usable.
          if (w >= 0 && val(prog, w).def_step == step) return false;
          if (w >= 0 && before_slot_reads &&
              std::find(s.slot_sources.begin(), s.slot_sources.end(), w) != s.slot_sources.end()) {
            return false;
          }
          return next_reservation(p, step + 1) >= last;
        };
        // 1. In place over an input of this step that dies here.
        for (int in : ins) {
          const int p = plan.storage_of[static_cast<size_t>(in)];
          if (cur[static_cast<size_t>(p)] == in && usable(p)) {
            chosen = p;
            break;
          }
        }
        // 2. Any free storage, soonest-reserved first (keeps long-free storages for long-lived
        //    values), then buffers in id order.
        if (chosen < 0) {
          int best_res = std::numeric_limits<int>::max();
          for (int p = 0; p < plan.num_storages(); ++p) {
            if (!usable(p)) continue;
            const int r = next_reservation(p, step + 1);
            if (chosen < 0 || r < best_res) {
              chosen = p;
              best_res = r;
            }
          }
        }
        if (chosen < 0) {
          chosen = add_buffer(plan);
          cur.push_back(-1);
        }
      }
      plan.storage_of[static_cast<size_t>(v)] = chosen;
      cur[static_cast<size_t>(chosen)] = v;
    }
  }
  return plan;
}

}  // namespace

Plan make_plan(const Program& program, Policy policy) {
  switch (policy) {
    case Policy::kSeparate:
      return separate_plan(program);
    case Policy::kUnrestricted:
      return unrestricted_plan(program, policy, false);
    case Policy::kPreserveFinal:
      return unrestricted_plan(program, policy, true);
    case Policy::kPlanned:
      return planned_plan(program);
  }
  return separate_plan(program);
}

}  // namespace attnres
