// The plan verifier and plan printing (plan.h).
//
// The simulation follows the fused step's per-row order (kernels/attnres.h): a read step first
// reads rs_in and pending, writes rs_out and the commit (pass 1), then reads the bank slots and
// the running sum (passes 2-3) and writes `out` column by column after reading that column. So:
//  - a write of rs_out or of the commit destroys a value if the value is still read after this
//    step, or is a bank slot source of this same step (read in pass 2, after the write);
//  - a write of `out` (or of a sublayer output over its input) destroys a value only if the
//    value is read after this step.
// The report lists every reader of the victim from the writing step on.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "plan/plan.h"

namespace attnres {

Result<std::vector<Hazard>> verify_plan(const Program& prog, const Plan& plan) {
  if (plan.storage_of.size() != prog.values.size()) {
    return Status(ErrorCode::kInvalidArgument,
                  "plan (" + std::string(policy_name(plan.policy)) + ") maps " +
                      std::to_string(plan.storage_of.size()) + " values, program has " +
                      std::to_string(prog.values.size()));
  }
  for (size_t v = 0; v < plan.storage_of.size(); ++v) {
    const int st = plan.storage_of[v];
    if (st < 0 || st >= plan.num_storages()) {
      return Status(ErrorCode::kInvalidArgument,
                    "plan (" + std::string(policy_name(plan.policy)) + "): value '" +
                        prog.values[v].name + "' has storage " + std::to_string(st) +
                        ", expected 0.." + std::to_string(plan.num_storages() - 1));
    }
  }
  std::vector<int> cur(static_cast<size_t>(plan.num_storages()), -1);
  std::vector<Hazard> hazards;
  auto write = [&](int step, int v, bool before_slot_reads) {
    const int p = plan.storage_of[static_cast<size_t>(v)];
    const int w = cur[static_cast<size_t>(p)];
    cur[static_cast<size_t>(p)] = v;
    if (w < 0 || w == v) return;
    const Value& victim = prog.values[static_cast<size_t>(w)];
    const Step& s = prog.steps[static_cast<size_t>(step)];
    const bool read_later = victim.last_reader() > step;
    const bool read_now_after =
        before_slot_reads &&
        std::find(s.slot_sources.begin(), s.slot_sources.end(), w) != s.slot_sources.end();
    if (!read_later && !read_now_after) return;
    Hazard h;
    h.step = step;
    h.layer = s.layer;
    h.step_name = s.name;
    h.storage = p;
    h.storage_name = plan.storages[static_cast<size_t>(p)].name;
    h.victim = w;
    h.victim_name = victim.name;
    h.written = v;
    for (int r : victim.readers) {
      if (r >= step) {
        h.readers.push_back(r);
        h.reader_names.push_back(prog.step_name(r));
      }
    }
    hazards.push_back(std::move(h));
  };
  for (size_t si = 0; si < prog.steps.size(); ++si) {
    const Step& s = prog.steps[si];
    const int step = static_cast<int>(si);
    if (s.rs_out >= 0) write(step, s.rs_out, true);
    if (s.commit >= 0) write(step, s.commit, true);
    if (s.out >= 0) write(step, s.out, false);
  }
  return hazards;
}

int peak_live_storages(const Program& prog, const Plan& plan) {
  const size_t steps = static_cast<size_t>(prog.output_step()) + 1;
  const size_t ns = static_cast<size_t>(plan.num_storages());
  std::vector<char> used(steps * ns, 0);  // [steps, storages]
  for (size_t v = 0; v < prog.values.size() && v < plan.storage_of.size(); ++v) {
    const Value& val = prog.values[v];
    const int st = plan.storage_of[v];
    if (st < 0 || static_cast<size_t>(st) >= ns) continue;
    for (int s = std::max(val.def_step, 0); s <= val.last_reader(); ++s) {
      used[static_cast<size_t>(s) * ns + static_cast<size_t>(st)] = 1;
    }
  }
  int best = 0;
  for (size_t s = 0; s < steps; ++s) {
    int n = 0;
    for (size_t k = 0; k < ns; ++k) n += used[s * ns + k];
    best = std::max(best, n);
  }
  return best;
}

std::string format_hazard(const Hazard& h) {
  std::string r = h.step_name + " writes storage " + h.storage_name + ", destroying '" +
                  h.victim_name + "', still read by";
  for (size_t i = 0; i < h.reader_names.size(); ++i) {
    r += (i ? ", " : " ") + h.reader_names[i];
  }
  return r;
}

std::string format_plan(const Program& prog, const Plan& plan) {
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "%-18s %-12s %-14s %-14s %s\n", "value", "kind", "defined",
                "last reader", "storage");
  o << line;
  for (size_t v = 0; v < prog.values.size(); ++v) {
    const Value& val = prog.values[v];
    const int st = v < plan.storage_of.size() ? plan.storage_of[v] : -1;
    std::snprintf(line, sizeof line, "%-18s %-12s %-14s %-14s %s\n", val.name.c_str(),
                  std::string(value_kind_name(val.kind)).c_str(),
                  prog.step_name(val.def_step).c_str(), prog.step_name(val.last_reader()).c_str(),
                  st >= 0 && st < plan.num_storages()
                      ? plan.storages[static_cast<size_t>(st)].name.c_str()
                      : "?");
    o << line;
  }
  return o.str();
}

}  // namespace attnres
