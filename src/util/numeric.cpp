#include "util/numeric.h"

#include <cmath>
#include <limits>

namespace attnres {

float fp8_e4m3_to_f32(uint8_t v) {
  const uint32_t sign = v >> 7;
  const uint32_t exp = (v >> 3) & 0xf;
  const uint32_t man = v & 0x7;
  float out;
  if (exp == 0xf && man == 0x7) {
    out = std::numeric_limits<float>::quiet_NaN();
  } else if (exp == 0) {
    out = std::ldexp(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
  } else {
    out = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, static_cast<int>(exp) - 7);
  }
  return sign ? -out : out;
}

uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= kFp8E4m3Max) return sign | 0x7e;  // saturate to 448
  // Enumerate by exponent: e4m3 has 3 mantissa bits; quantum is 2^(e-3) for normals
  // (e >= -6) and 2^-9 for subnormals.
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp_unbiased = e - 1;
  if (exp_unbiased < -6) exp_unbiased = -6;
  const float quantum = std::ldexp(1.0f, exp_unbiased - 3);
  float q = std::nearbyint(a / quantum) * quantum;  // round half to even (default mode)
  if (q >= kFp8E4m3Max) return sign | 0x7e;
  // Encode q exactly.
  if (q == 0.0f) return sign;
  int qe;
  std::frexp(q, &qe);
  int ue = qe - 1;
  if (ue < -6) {  // subnormal
    const int man = static_cast<int>(q / std::ldexp(1.0f, -9));
    return sign | static_cast<uint8_t>(man);
  }
  const int man = static_cast<int>((q / std::ldexp(1.0f, ue) - 1.0f) * 8.0f);
  return sign | static_cast<uint8_t>(((ue + 7) << 3) | man);
}

}  // namespace attnres
