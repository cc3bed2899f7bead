// libFuzzer target: parse_safetensors_header() on arbitrary bytes (the whole input is the file).
// Invariants checked on success: every tensor range lies inside the input (each range's first
// and last byte is read, so ASan reports any escape), sizes match shape x dtype, and non-empty
// ranges do not overlap.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  auto h = attnres::parse_safetensors_header(file, "fuzz-input");
  if (!h.is_ok()) {
    if (h.status().message().empty()) std::abort();  // every error explains itself
    return 0;
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  volatile std::byte sink{};
  for (const attnres::SafetensorsEntry& e : h->tensors) {
    uint64_t bytes = attnres::dtype_size(e.dtype);
    for (int64_t d : e.shape) bytes *= static_cast<uint64_t>(d);  // validated: no overflow
    if (bytes != e.end - e.begin || h->data_offset + e.end > size) std::abort();
    if (e.end > e.begin) {
      sink = file[h->data_offset + e.begin];
      sink = file[h->data_offset + e.end - 1];
      ranges.emplace_back(e.begin, e.end);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) std::abort();
  (void)sink;
  return 0;
}
