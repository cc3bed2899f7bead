// JSON forms of plan results shared by `attnres plan` and `attnres harness`.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "plan/plan.h"

namespace attnres {

// {"layer", "step", "storage", "victim", "readers": [step names]}
inline nlohmann::json hazard_json(const Hazard& h) {
  return {{"layer", h.layer},        {"step", h.step_name},  {"storage", h.storage_name},
          {"victim", h.victim_name}, {"written", h.written}, {"readers", h.reader_names}};
}

inline nlohmann::json hazards_json(const std::vector<Hazard>& hs) {
  nlohmann::json a = nlohmann::json::array();
  for (const Hazard& h : hs) a.push_back(hazard_json(h));
  return a;
}

}  // namespace attnres
