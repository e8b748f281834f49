// Scalar fp16 / bf16 <-> fp32 conversions: the rounding contract of every
// 16-bit value strata writes, and the oracle for the vector kernels.
//
// fp32 -> fp16 and fp32 -> bf16 round to nearest, ties to even. Overflow gives
// inf (as torch's .half() does). NaN stays NaN, in the form torch 1.13 writes
// on x86 so that our 16-bit params equal torch's bit for bit:
//   fp16: sign | 0x7E00 (payload dropped; c10::Half's conversion),
//   bf16: 0xFFFF (what torch's AVX2/AVX-512 cvtfp32_bf16 produces).
// fp16/bf16 -> fp32 is exact; an fp16 signalling NaN comes back quiet (as F16C
// does), a bf16 one keeps its bits (the conversion is a shift).
#ifndef STRATA_OPTIMIZER_CPU_HALF_H_
#define STRATA_OPTIMIZER_CPU_HALF_H_

#include <cstdint>

namespace strata {

uint16_t Fp32ToFp16Bits(float value);
float Fp16BitsToFp32(uint16_t bits);
uint16_t Fp32ToBf16Bits(float value);
float Bf16BitsToFp32(uint16_t bits);

}  // namespace strata

#endif  // STRATA_OPTIMIZER_CPU_HALF_H_
