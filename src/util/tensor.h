// DType and TensorView: a typed, shaped, non-owning view of bytes (usually inside an mmap).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/numeric.h"

namespace attnres {

enum class DType {
  kF64,
  kF32,
  kF16,
  kBF16,
  kF8E4M3,
  kF8E5M2,
  kI64,
  kI32,
  kI16,
  kI8,
  kU64,
  kU32,
  kU16,
  kU8,
  kBool
};

// Safetensors dtype names ("F32", "BF16", "F8_E4M3", "U8", ...).
std::string_view dtype_name(DType d);
std::optional<DType> parse_dtype(std::string_view name);
size_t dtype_size(DType d);

// How a view's elements lie in memory: row-major (as files store them), the lane-packed form
// of a BF16 projection [N, K] (util/lanes.h; its storage holds lanes_size(N, K) values, the
// padding rows past nbytes), or the 16-row lane groups of an MXFP4 matrix's packed codes
// [N, K/2] or of its scales [N, K/32] (util/mxfp4_lanes.h; the views' shapes stay as stored).
// Readers that index the data themselves take row-major views only, or say which layouts they
// read; get_f32 reads the first two.
enum class Layout : uint8_t { kRowMajor, kBf16Lanes, kMxfp4Lanes };

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;
  Layout layout = Layout::kRowMajor;

  bool valid() const { return data != nullptr || nbytes == 0; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  int rank() const { return static_cast<int>(shape.size()); }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data);
  }
  // Element i (in row-major order, whatever the layout) widened to f32 (F32, BF16, F16 and
  // F8_E4M3 only).
  float get_f32(int64_t i) const;
  // "[a, b, c]"
  std::string shape_string() const;
};

std::string shape_to_string(std::span<const int64_t> shape);

}  // namespace attnres
