#include "optimizer_cpu/half.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "gtest/gtest.h"

namespace strata {
namespace {

float FloatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The nearest representable 16-bit value by brute force over all 65536
// patterns of the same sign: the oracle of the oracle.
uint16_t NearestByBruteForce(float x, float (*to_f32)(uint16_t)) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  uint16_t best = 0;
  double best_diff = INFINITY;
  for (uint32_t b = 0; b < 0x8000; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b | sign);
    const float f = to_f32(bits);
    if (std::isnan(f)) continue;
    const double diff = std::fabs(static_cast<double>(f) - x);
    // Ties go to the even pattern.
    if (diff < best_diff || (diff == best_diff && (bits & 1) == 0)) {
      best = bits;
      best_diff = diff;
    }
  }
  return best;
}

TEST(HalfTest, Fp16RoundTripsEveryNonNanPattern) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = Fp16BitsToFp32(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_EQ(Fp32ToFp16Bits(f), (b & 0x8000) | 0x7E00) << std::hex << b;
    } else {
      EXPECT_EQ(Fp32ToFp16Bits(f), b) << std::hex << b;
    }
  }
}

TEST(HalfTest, Bf16RoundTripsEveryNonNanPattern) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = Bf16BitsToFp32(static_cast<uint16_t>(b));
    EXPECT_EQ(Fp32ToBf16Bits(f), std::isnan(f) ? 0xFFFF : b) << std::hex << b;
  }
}

TEST(HalfTest, RoundsToNearestEvenLikeBruteForce) {
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i) {
    // Values inside fp16's range (incl. subnormals) and exact ties.
    float x = FloatOf((static_cast<uint32_t>(rng()) & 0x87FFFFFFu) | 0x30000000u);
    if (i % 3 == 0) x = FloatOf((static_cast<uint32_t>(rng()) & 0xFFFFE000u) | 0x1000u);
    if (std::fabs(x) >= 65520.0f || std::isnan(x)) continue;
    EXPECT_EQ(Fp32ToFp16Bits(x), NearestByBruteForce(x, Fp16BitsToFp32)) << x;
    if (std::fabs(x) < 3e38f) {
      EXPECT_EQ(Fp32ToBf16Bits(x), NearestByBruteForce(x, Bf16BitsToFp32)) << x;
    }
  }
}

TEST(HalfTest, OverflowInfAndNanFollowTorch) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Fp32ToFp16Bits(65504.0f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16Bits(65519.99f), 0x7BFF);
  EXPECT_EQ(Fp32ToFp16Bits(65520.0f), 0x7C00);  // rounds up to inf, as .half() does
  EXPECT_EQ(Fp32ToFp16Bits(-1e10f), 0xFC00);
  EXPECT_EQ(Fp32ToFp16Bits(inf), 0x7C00);
  EXPECT_EQ(Fp32ToFp16Bits(FloatOf(0x7FC12345u)), 0x7E00);
  EXPECT_EQ(Fp32ToFp16Bits(FloatOf(0xFFA00001u)), 0xFE00);
  EXPECT_EQ(Fp32ToFp16Bits(3e-8f), 0x0001);  // above half the smallest subnormal
  EXPECT_EQ(Fp32ToFp16Bits(2.98e-8f), 0x0000);
  EXPECT_EQ(Fp32ToBf16Bits(FloatOf(0x7F7FFFFFu)), 0x7F80);  // max float rounds to inf
  EXPECT_EQ(Fp32ToBf16Bits(-inf), 0xFF80);
  EXPECT_EQ(Fp32ToBf16Bits(FloatOf(0xFFC00000u)), 0xFFFF);
  EXPECT_EQ(Fp32ToBf16Bits(FloatOf(0x3F808000u)), 0x3F80);  // tie to even (down)
  EXPECT_EQ(Fp32ToBf16Bits(FloatOf(0x3F818000u)), 0x3F82);  // tie to even (up)
  // An fp16 signalling NaN comes back quiet.
  const float quiet = Fp16BitsToFp32(0x7C01);
  uint32_t bits;
  std::memcpy(&bits, &quiet, 4);
  EXPECT_EQ(bits, 0x7FC02000u);
}

}  // namespace
}  // namespace strata
