#include "optimizer_cpu/moment_format.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Round-half-away-from-zero of a non-negative double that is exact (a float
// times a power of two, plus 0.5: no rounding in double).
uint32_t RoundHalfUp(double v) { return static_cast<uint32_t>(std::floor(v + 0.5)); }

// The code magnitude of a non-negative value on the grid of the fp16 numbers
// with a 3-bit mantissa (exponent field E = 1..30 above 2^-14, E = 0 below):
// written from the definition, not from the kernels' bit tricks, so that the
// kernel tests compare two formulations.
uint32_t GridCode(double a) {
  if (a < 0x1p-14) return RoundHalfUp(a * 0x1p17);  // E = 0: steps of 2^-17; 8 is E = 1
  int e = 0;
  const double q = std::frexp(a, &e);  // a = q * 2^e, q in [0.5, 1)
  const int exponent = e - 1;          // a = (2q) * 2^exponent, 2q in [1, 2)
  const uint32_t steps = RoundHalfUp((2 * q - 1) * 8);  // 8 carries into the next binade
  return (static_cast<uint32_t>(exponent + 15) << 3) + steps;
}

}  // namespace

absl::string_view MomentFormatName(MomentFormat format) {
  switch (format) {
    case MomentFormat::kFp32:
      return "fp32";
    case MomentFormat::kBf16:
      return "bf16";
    case MomentFormat::kBlockwise8:
      return "blockwise8";
  }
  return "unknown";
}

absl::StatusOr<MomentFormat> ParseMomentFormat(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "fp32" || t == "float32") return MomentFormat::kFp32;
  if (t == "bf16" || t == "bfloat16") return MomentFormat::kBf16;
  if (t == "blockwise8" || t == "int8" || t == "8bit") return MomentFormat::kBlockwise8;
  return absl::InvalidArgumentError(absl::StrCat(
      "moment format '", text, "' is not one of fp32, bf16, blockwise8 (or int8, 8bit)"));
}

double MomentBytesPerElement(MomentFormat format) {
  switch (format) {
    case MomentFormat::kFp32:
      return 4;
    case MomentFormat::kBf16:
      return 2;
    case MomentFormat::kBlockwise8:
      return 1 + 4.0 / kMomentBlock;
  }
  return 0;
}

float Moment8CodeValue(uint8_t code, MomentMap map) {
  // 0xF8..0xFF of kUnsigned are fp16's exponent 31: inf and NaN, as the
  // kernels' fp16 conversion reads them. The encoder never writes them.
  if (map == MomentMap::kUnsigned && code >= 0xF8) {
    return code == 0xF8 ? std::numeric_limits<float>::infinity()
                        : std::numeric_limits<float>::quiet_NaN();
  }
  const uint32_t mag = map == MomentMap::kSigned ? (code & 0x7Fu) : code;
  const uint32_t e = mag >> 3;
  const uint32_t m = mag & 7u;
  const double a = e == 0 ? std::ldexp(m / 8.0, -14) : std::ldexp(1 + m / 8.0, static_cast<int>(e) - 15);
  const bool negative = map == MomentMap::kSigned && (code & 0x80u) != 0;
  return static_cast<float>(negative ? -a : a);
}

uint8_t Moment8Code(float scaled, MomentMap map) {
  const uint32_t mag = GridCode(std::fabs(static_cast<double>(scaled)));
  if (map == MomentMap::kUnsigned) return static_cast<uint8_t>(mag);
  return static_cast<uint8_t>(mag | (std::signbit(scaled) ? 0x80u : 0u));
}

float Moment8EncodeFactor(float absmax, MomentMap map) {
  return map == MomentMap::kSigned ? 1.0f / absmax : 32768.0f / absmax;
}

float Moment8DecodeFactor(float absmax, MomentMap map) {
  return map == MomentMap::kSigned ? absmax : absmax * 0x1p-15f;
}

float QuantizeMomentBlock8(const float* values, size_t n, MomentMap map, uint8_t* codes) {
  // The largest magnitude by its bits: exact, independent of order, and a
  // NaN (bits above inf's) wins, as it does in the kernels.
  uint32_t max_bits = 0;
  for (size_t i = 0; i < n; ++i) max_bits = std::max(max_bits, Bits(values[i]) & 0x7FFFFFFFu);
  if (max_bits >= 0x7F800000u || max_bits < Bits(kMomentFlushBelow)) {
    std::memset(codes, 0, n);
    return max_bits >= 0x7F800000u ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
  }
  float absmax;
  std::memcpy(&absmax, &max_bits, sizeof(absmax));
  const float factor = Moment8EncodeFactor(absmax, map);
  for (size_t i = 0; i < n; ++i) {
    const float scaled = values[i] * factor;
    uint8_t code = Moment8Code(scaled, map);
    if (map == MomentMap::kUnsigned && code == 0) code = 1;  // never 0 in a nonzero block
    codes[i] = code;
  }
  return absmax;
}

void DequantizeMomentBlock8(const uint8_t* codes, size_t n, float absmax, MomentMap map,
                            float* values) {
  const float factor = Moment8DecodeFactor(absmax, map);
  for (size_t i = 0; i < n; ++i) values[i] = Moment8CodeValue(codes[i], map) * factor;
}

}  // namespace strata
