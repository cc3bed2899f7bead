// Test helper for the dispatched (Highway) kernels: run a body once per target.
#pragma once

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <type_traits>

namespace attnres {

// Runs body once per Highway target compiled into this binary and supported by this CPU, with
// dispatch forced to that target (failures name it), then restores normal dispatch. A body that
// takes an int64_t receives the target.
template <class Body>
void for_each_target(const Body& body) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    if constexpr (std::is_invocable_v<const Body&, int64_t>) {
      body(target);
    } else {
      body();
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace attnres
