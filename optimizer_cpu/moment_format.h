// How an optimizer's moments are stored: fp32 (torch's format), bf16, or
// 8-bit blockwise codes with one fp32 scale per block of kMomentBlock
// elements. The fp32 master params are always fp32. This header holds the
// formats' definitions and the scalar codec (the oracle the vector kernels
// match bit for bit, and the conversion a checkpoint export or a job
// converted at load uses); the kernels read and write the compressed forms in
// the step's one pass (see StepSpans and docs/OPTIMIZER.md).
//
// bf16: fp32 -> bf16 rounds to nearest, ties to even (half.h: NaN -> 0xFFFF);
// bf16 -> fp32 is exact.
//
// 8-bit blockwise ("blockwise8"): the elements of a moment tensor are cut into
// blocks of kMomentBlock from its first element (the last block may be
// shorter). A block stores `absmax`, the largest |value| of the block (fp32),
// and one byte per element: a floating-point code of the value divided by
// absmax. Two maps:
//
//   kSigned   (exp_avg of Adam/AdamW, Lion's momentum): S.EEEE.MMM, value
//             x = (-1)^S * 2^(E-15) * (1 + M/8), E = 0: (-1)^S * 2^-14 * M/8.
//             These are the fp16 numbers <= 1 in magnitude with their
//             mantissa cut to 3 bits. x = m * (1/absmax) in [-1, 1] uses
//             0x00..0x78 and 0x80..0xF8 (241 of 256 codes).
//   kUnsigned (exp_avg_sq, max_exp_avg_sq, Adagrad's sum): EEEEE.MMM, the
//             non-negative fp16 numbers with a 3-bit mantissa, of
//             y = v * (32768/absmax) in [0, 32768] (codes 0x00..0xF0).
//
// Encoding rounds to the nearest code, ties away from zero; a block whose
// absmax is not finite gets absmax NaN and zero codes (every element reads
// back NaN, as its fp32 moment would have been for the element that
// overflowed); a block whose absmax is below kMomentFlushBelow (or 0) is
// stored as zeros. kUnsigned never writes code 0 in a nonzero block: a
// second moment that is not zero never reads back as 0 (it reads at least
// 2^-32 * absmax), so an update m / (sqrt(v) + eps) cannot blow up because v
// rounded to zero while m did not.
//
// Decoding: kSigned: x * absmax; kUnsigned: y * (absmax * 2^-15), each
// product in fp32 (one rounding).
//
// Error: relative to the element, at most 2^-4 (6.25%) for |value| >=
// 2^-14 * absmax (kSigned) or >= 2^-29 * absmax (kUnsigned); below that the
// absolute error is at most 2^-18 * absmax (kSigned: smaller elements become
// 0) and 2^-33 * absmax (kUnsigned). See docs/OPTIMIZER.md for the choice.
#ifndef STRATA_OPTIMIZER_CPU_MOMENT_FORMAT_H_
#define STRATA_OPTIMIZER_CPU_MOMENT_FORMAT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

enum class MomentFormat : uint8_t { kFp32 = 0, kBf16 = 1, kBlockwise8 = 2 };

// "fp32", "bf16", "blockwise8".
absl::string_view MomentFormatName(MomentFormat format);
// The names above, case-insensitive; also "int8" and "8bit" for kBlockwise8.
absl::StatusOr<MomentFormat> ParseMomentFormat(absl::string_view text);

// Elements per 8-bit block, and the number of blocks of a tensor.
inline constexpr size_t kMomentBlock = 256;
constexpr size_t MomentBlocks(size_t elements) {
  return (elements + kMomentBlock - 1) / kMomentBlock;
}

// Bytes one moment of one element occupies: 4, 2, or 1 + 4/256.
double MomentBytesPerElement(MomentFormat format);

enum class MomentMap : uint8_t { kSigned, kUnsigned };

// 2^-100: smaller block maxima are stored as zeros (so that 1/absmax,
// 32768/absmax and absmax * 2^-15 are exact powers-of-two scalings).
inline constexpr float kMomentFlushBelow = 0x1p-100f;

// One code <-> its value before the block scale (x of kSigned, y of
// kUnsigned). Exact. kUnsigned's codes 0xF8..0xFF, which the encoder never
// writes, read as fp16 reads them: inf (0xF8) and NaN.
float Moment8CodeValue(uint8_t code, MomentMap map);
// The code of a scaled value (x or y, already multiplied by the encode
// factor below): nearest, ties away from zero. REQUIRES: finite, |x| <=
// 1.875 (kSigned), 0 <= y <= 61440 (kUnsigned); a block's values are within
// 1 + 2^-23 of 1 and of 32768. Does not apply kUnsigned's no-zero rule
// (QuantizeMomentBlock8 does).
uint8_t Moment8Code(float scaled, MomentMap map);

// The factors a block's codes are encoded and decoded with, in fp32:
// kSigned 1/absmax and absmax; kUnsigned 32768/absmax and absmax * 2^-15.
float Moment8EncodeFactor(float absmax, MomentMap map);
float Moment8DecodeFactor(float absmax, MomentMap map);

// Quantizes n <= kMomentBlock values into codes; returns the block's absmax
// to store (NaN, 0 or the largest |value|, per the rules above).
float QuantizeMomentBlock8(const float* values, size_t n, MomentMap map, uint8_t* codes);
// values[i] = code value * decode factor of `absmax`.
void DequantizeMomentBlock8(const uint8_t* codes, size_t n, float absmax, MomentMap map,
                            float* values);

}  // namespace strata

#endif  // STRATA_OPTIMIZER_CPU_MOMENT_FORMAT_H_
