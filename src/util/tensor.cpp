#include "util/tensor.h"

#include <bit>
#include <cstring>

#include "util/lanes.h"

namespace attnres {
namespace {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4},        {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kI64, "I64", 8},   {DType::kI32, "I32", 4},        {DType::kI16, "I16", 2},
    {DType::kI8, "I8", 1},     {DType::kU64, "U64", 8},        {DType::kU32, "U32", 4},
    {DType::kU16, "U16", 2},   {DType::kU8, "U8", 1},          {DType::kBool, "BOOL", 1},
};

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    v = man ? std::nanf("") : INFINITY;
  } else {
    v = std::ldexp(1.0f + static_cast<float>(man) / 1024.0f, static_cast<int>(exp) - 15);
  }
  return sign ? -v : v;
}
}  // namespace

std::string_view dtype_name(DType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return i.name;
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& i : kDTypes)
    if (i.name == name) return i.dtype;
  return std::nullopt;
}

size_t dtype_size(DType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return i.size;
  return 0;
}

float TensorView::get_f32(int64_t i) const {
  if (layout == Layout::kBf16Lanes) {
    const int64_t N = shape[0], K = shape[1];
    i = lanes_index(i / K, i % K, N, K);
  }
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, data + i * 4, 4);
      return f;
    }
    case DType::kBF16: {
      bf16 b;
      std::memcpy(&b.bits, data + i * 2, 2);
      return bf16_to_f32(b);
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, data + i * 2, 2);
      return f16_to_f32(h);
    }
    case DType::kF8E4M3:
      return fp8_e4m3_to_f32(static_cast<uint8_t>(data[i]));
    default:
      return std::nanf("");
  }
}

std::string shape_to_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string TensorView::shape_string() const {
  return shape_to_string(shape);
}

}  // namespace attnres
