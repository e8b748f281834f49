#include "optimizer_cpu/half.h"

#include <cmath>
#include <cstring>

namespace strata {
namespace {

uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

float FloatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace

// Written as plain IEEE arithmetic on the bit fields (not Giesen's magic-add
// trick the vector code uses) so that the oracle is independent of the code it
// checks.
uint16_t Fp32ToFp16Bits(float value) {
  const uint32_t bits = BitsOf(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  if (std::isnan(value)) return sign | 0x7E00u;
  const float magnitude = std::fabs(value);
  if (std::isinf(value) || magnitude >= 65520.0f) return sign | 0x7C00u;  // 65520 rounds up to inf
  if (magnitude < 0x1p-14f) {
    // Subnormal fp16: a multiple of 2^-24. nearbyint rounds half to even in
    // the default rounding mode, and magnitude * 2^24 is exact.
    const float units = std::nearbyint(magnitude * 0x1p24f);
    return sign | static_cast<uint16_t>(units);  // 1024 units is the smallest normal
  }
  int exponent;
  std::frexp(magnitude, &exponent);  // magnitude = f * 2^exponent, f in [0.5, 1)
  // Scale so that the 11 significant bits are the integer part, then round.
  const float scaled = std::ldexp(magnitude, 11 - exponent);  // in [1024, 2048)
  uint32_t significand = static_cast<uint32_t>(std::nearbyint(scaled));
  int biased = exponent - 1 + 15;
  if (significand == 2048) {  // rounding carried into the next binade
    significand = 1024;
    ++biased;
  }
  if (biased >= 31) return sign | 0x7C00u;
  return sign | static_cast<uint16_t>((biased << 10) | (significand - 1024));
}

float Fp16BitsToFp32(uint16_t bits) {
  const float sign = (bits & 0x8000u) ? -1.0f : 1.0f;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  if (exponent == 31) {
    if (mantissa == 0) return sign * INFINITY;
    // Keep the payload, set the quiet bit.
    return FloatOf((static_cast<uint32_t>(bits & 0x8000u) << 16) | 0x7FC00000u |
                   (mantissa << 13));
  }
  return sign * std::ldexp(static_cast<float>(mantissa + 1024), static_cast<int>(exponent) - 25);
}

uint16_t Fp32ToBf16Bits(float value) {
  if (std::isnan(value)) return 0xFFFFu;
  const uint32_t bits = BitsOf(value);
  const uint32_t lower = bits & 0xFFFFu;
  uint32_t upper = bits >> 16;
  // Ties go to the even upper half; a carry out of the mantissa correctly
  // bumps the exponent, and the largest finite values round up to inf.
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) ++upper;
  return static_cast<uint16_t>(upper);
}

float Bf16BitsToFp32(uint16_t bits) {
  return FloatOf(static_cast<uint32_t>(bits) << 16);
}

}  // namespace strata
