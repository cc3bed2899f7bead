// Storage plans: which physical [T, d] storage holds each value of a Program, the four policies
// that make them, and the verifier that checks any plan.
//
// A Plan is plain data (value id -> storage id; storages named, bank slots included) that can be
// printed, serialised and checked independently of the code that made it. Storages 0..S-1 are
// the bank slots (slot k may hold other values before its commit); the others are buffers.
//
// Policies (attnres-storage.md):
//   separate       every value gets storage of its own, taken when it is defined and released
//                  after its last reader; no step writes over storage holding another value.
//   unrestricted   the pre-fix reuse rules 1..8 of attnres-storage.md, reproduced faithfully.
//   preserve-final unrestricted plus the published fix: fresh storage for the post-attention
//                  mixture of the layer that commits the last slot.
//   planned        liveness: a value reuses storage whose current value has no later reader; the
//                  running sum of block k lives in slot k+1 (so its commit copies nothing), the
//                  embedding in slot 0; uses exactly lower_bound_buffers() storages.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "plan/program.h"
#include "util/status.h"

namespace attnres {

enum class Policy { kSeparate, kUnrestricted, kPreserveFinal, kPlanned };
inline constexpr Policy kAllPolicies[] = {Policy::kSeparate, Policy::kUnrestricted,
                                          Policy::kPreserveFinal, Policy::kPlanned};
std::string_view policy_name(Policy p);  // "separate", "unrestricted", "preserve-final", "planned"
std::optional<Policy> parse_policy(std::string_view name);

struct Storage {
  std::string name;    // "slot7", "buf0"
  int bank_slot = -1;  // k for bank slot storages
};

struct Plan {
  Policy policy = Policy::kPlanned;
  std::vector<Storage> storages;
  std::vector<int> storage_of;  // [values] storage id of each value

  int num_storages() const { return static_cast<int>(storages.size()); }
};

Plan make_plan(const Program& program, Policy policy);

// Most storages holding live values at once (a value is live during its defining step through
// its last reader). <= num_storages().
int peak_live_storages(const Program& program, const Plan& plan);

// A step that writes storage whose current value is still read at a later step.
struct Hazard {
  int step = -1;
  int layer = -1;         // layer of the writing step (-1: embed/final)
  std::string step_name;  // "L84.pre_mlp"
  int storage = -1;
  std::string storage_name;
  int victim = -1;  // value destroyed
  std::string victim_name;
  int written = -1;          // value written
  std::vector<int> readers;  // steps >= the writing step that read the victim
  std::vector<std::string> reader_names;
};

// Simulates the plan: every read must see the value it expects and no write may destroy a value
// that a later step reads. Returns every hazard, in step order. Structural errors (a value
// without storage, a storage id out of range) are returned as kInvalidArgument.
Result<std::vector<Hazard>> verify_plan(const Program& program, const Plan& plan);

// Lifetime table: value, kind, defining step, last reader, storage.
std::string format_plan(const Program& program, const Plan& plan);
std::string format_hazard(const Hazard& h);

}  // namespace attnres
