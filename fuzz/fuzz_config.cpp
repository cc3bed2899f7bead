// libFuzzer target: parse_model_config() on arbitrary text. Invariants checked on success: the
// schedule has one entry per layer, its kind counts add up, and every commit slot is in range.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto c = attnres::parse_model_config(text, "fuzz-input");
  if (!c.is_ok()) {
    if (c.status().message().empty()) std::abort();
    return 0;
  }
  const attnres::LayerSchedule& s = c->schedule;
  if (s.num_layers() != c->num_hidden_layers) std::abort();
  if (s.num_kda + s.num_mla != s.num_layers() || s.num_dense + s.num_moe != s.num_layers())
    std::abort();
  for (const attnres::LayerInfo& l : s.layers) {
    if (l.commit_slot && (*l.commit_slot < 0 || *l.commit_slot >= s.bank_slots)) std::abort();
    if (l.pre_attn_sources > s.max_sources || l.pre_mlp_sources > s.max_sources) std::abort();
  }
  return 0;
}
