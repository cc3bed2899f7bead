// SplitMix64: the small, fixed, platform-independent generator behind every deterministic
// stream in attnres (synthetic weights, harness stand-ins, sampler seeding). The same seed gives
// the same numbers on every machine and thread count.
#pragma once

#include <cstdint>

namespace attnres {

struct SplitMix64 {
  uint64_t state = 0;

  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi) from the top 24 bits (exact in f32).
  float uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }
};

}  // namespace attnres
