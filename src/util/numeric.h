// Scalar storage types: bf16, fp8 e4m3 (OCP), MXFP4 (E2M1 codes with E8M0 block scales).
// These scalar conversions define the numerics; SIMD paths must reproduce them bit for bit.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace attnres {

// bfloat16 stored as its raw 16 bits (the high half of an IEEE binary32).
struct bf16 {
  uint16_t bits = 0;
};
static_assert(sizeof(bf16) == 2);

inline float bf16_to_f32(bf16 v) {
  return std::bit_cast<float>(uint32_t{v.bits} << 16);
}

// Round to nearest even, as torch's float->bfloat16 cast. NaN stays NaN (quiet).
inline bf16 f32_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

// f32 value rounded to the nearest bf16 value (kept in an f32).
inline float round_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

// Activation storage element (bf16 or f32) widened to f32, and the storage cast T(x) (round to
// nearest even for bf16). Shared by the scalar AttnRes reference and the SIMD kernels' tails.
template <typename T>
inline float storage_to_f32(T v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16_to_f32(v);
  } else {
    return v;
  }
}
template <typename T>
inline T f32_to_storage(float x) {
  if constexpr (std::is_same_v<T, bf16>) {
    return f32_to_bf16(x);
  } else {
    return x;
  }
}

// OCP fp8 e4m3fn: bias 7, no infinities, 0x7f/0xff = NaN, max finite 448.
float fp8_e4m3_to_f32(uint8_t v);
// Round to nearest even, saturating to +-448 (as torch's cast with saturation).
uint8_t f32_to_fp8_e4m3(float f);
inline constexpr float kFp8E4m3Max = 448.0f;

// E2M1 (MXFP4 element) code -> value. Code bit 3 is the sign; 8 is -0.0.
inline constexpr float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
// E8M0 scale (bias 127) -> 2^(s-127); 255 encodes NaN.
inline float e8m0_to_f32(uint8_t s) {
  if (s == 255) return std::nanf("");
  if (s == 0) return std::ldexp(1.0f, -127);
  return std::bit_cast<float>(uint32_t{s} << 23);
}
inline constexpr int kMxfp4BlockSize = 32;

// Element k of an MXFP4 row from the byte holding its code (low nibble = even k) and its
// block's scale byte.
inline float mxfp4_value(uint8_t byte, int64_t k, uint8_t scale) {
  const uint8_t code = (k & 1) ? (byte >> 4) : (byte & 0x0f);
  return kE2m1Values[code] * e8m0_to_f32(scale);
}

// Element k of an MXFP4 row: packed holds K/2 bytes (low nibble = even k), scale K/32 bytes.
inline float mxfp4_get(const uint8_t* packed_row, const uint8_t* scale_row, int64_t k) {
  return mxfp4_value(packed_row[k >> 1], k, scale_row[k / kMxfp4BlockSize]);
}

}  // namespace attnres
