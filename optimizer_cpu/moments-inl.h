// Per-target access to the optimizer moments in each MomentFormat, and the
// loops that run a kernel's per-element body over them in one pass.
//
// A kernel writes its body once against a moment accessor `mom`:
// mom.Load(d, k, i) returns moment k (0 exp_avg, 1 exp_avg_sq,
// 2 max_exp_avg_sq) of the lanes at element i as fp32, mom.Store(d, k, i, v)
// stores it back. ForEachMomentStep picks the accessor and the loop:
//   fp32: loads and stores in place (the kernels as before formats existed);
//   bf16: the 16-bit bits shifted up; stores round to nearest even;
//   blockwise8: per 256-element block, Load decodes the codes with the
//     block's stored absmax, Store keeps the new fp32 moments in a 1 KiB
//     stack buffer; after the block's params are done, the block's new
//     absmax is taken from that buffer and its codes are written. The
//     block's moments are read and written once, so the step stays one pass
//     over memory.
//
// The 8-bit codes are fp16 numbers with a 3-bit mantissa (moment_format.h),
// so the conversions are F16C's vcvtph2ps and vcvtps2ph (with truncation:
// adding half a code step to the truncated fp16 bits and shifting gives
// round-half-away-from-zero exactly, as the truncation keeps whether the
// value reached the midpoint) where the target has F16C, and integer code
// elsewhere.
//
// Included once per target by foreach_target.h, hence the toggle guard.
#if defined(STRATA_OPTIMIZER_CPU_MOMENTS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_OPTIMIZER_CPU_MOMENTS_INL_H_
#undef STRATA_OPTIMIZER_CPU_MOMENTS_INL_H_
#else
#define STRATA_OPTIMIZER_CPU_MOMENTS_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "hwy/highway.h"
#include "optimizer_cpu/half-inl.h"
#include "optimizer_cpu/moment_format.h"
#include "optimizer_cpu/step_spans.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {

// fp16 bits in u16 lanes -> fp32, exact.
template <class DF>
HWY_INLINE hn::Vec<DF> F16LanesToF32(DF df, hn::Vec<hn::Rebind<uint16_t, DF>> h) {
  if constexpr (kHaveF16C) {
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(df, hn::BitCast(df16, h));
  } else {
    const hn::RebindToUnsigned<DF> du;
    return F16BitsToF32(df, hn::PromoteTo(du, h));
  }
}

// fp32 -> fp16 bits in u16 lanes, rounded toward zero. REQUIRES: |v| < 65536
// and not NaN (the 8-bit codes' scaled values are at most 32768 * (1 + 2^-23)).
template <class DF>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> F32ToF16BitsTrunc(DF df, hn::Vec<DF> v) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  using VU16 = hn::Vec<hn::Rebind<uint16_t, DF>>;
  constexpr int kTrunc = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;
  if constexpr (hn::MaxLanes(df) == 16) {
    return VU16{_mm512_cvtps_ph(v.raw, kTrunc)};
  } else if constexpr (hn::MaxLanes(df) == 8) {
    return VU16{_mm256_cvtps_ph(v.raw, kTrunc)};
  } else {
    return VU16{_mm_cvtps_ph(v.raw, kTrunc)};
  }
#elif HWY_TARGET == HWY_AVX2
  using VU16 = hn::Vec<hn::Rebind<uint16_t, DF>>;
  constexpr int kTrunc = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;
  if constexpr (hn::MaxLanes(df) == 8) {
    return VU16{_mm256_cvtps_ph(v.raw, kTrunc)};
  } else {
    return VU16{_mm_cvtps_ph(v.raw, kTrunc)};
  }
#else
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  const auto bits = hn::BitCast(du, v);
  const auto sign = hn::And(bits, hn::Set(du, 0x80000000u));
  const auto abs = hn::Xor(bits, sign);
  // Normal fp16 (|v| >= 2^-14): rebias the exponent, drop 13 mantissa bits.
  const auto normal = hn::ShiftRight<13>(hn::Sub(abs, hn::Set(du, 112u << 23)));
  // Subnormal: the fp16 bits are trunc(|v| * 2^24); the scaling is exact.
  const auto sub = hn::BitCast(
      du, hn::ConvertTo(di, hn::Mul(hn::BitCast(df, abs), hn::Set(df, 0x1p24f))));
  const auto is_sub = hn::RebindMask(du, hn::Lt(hn::BitCast(di, abs), hn::Set(di, 113 << 23)));
  const auto h = hn::Or(hn::IfThenElse(is_sub, sub, normal), hn::ShiftRight<16>(sign));
  return hn::DemoteTo(du16, hn::BitCast(di, h));
#endif
}

// The lanes of moment codes at `codes`, decoded (see moment_format.h) and
// multiplied by the block's decode factor.
template <MomentMap kMap, class DF>
HWY_INLINE hn::Vec<DF> LoadMoment8(DF df, const uint8_t* codes, hn::Vec<DF> factor) {
  const hn::Rebind<uint8_t, DF> du8;
  const hn::Rebind<uint16_t, DF> du16;
  // S.EEEE.MMM -> fp16 S.0EEEE.MMM0000000; EEEEE.MMM -> fp16 0.EEEEE.MMM0000000.
  auto h = hn::ShiftLeft<7>(hn::PromoteTo(du16, hn::LoadU(du8, codes)));
  if constexpr (kMap == MomentMap::kSigned) {
    // The sign landed on fp16 bit 14 (the exponent's top bit, 0 for values
    // <= 1): adding it to itself carries it to bit 15 and clears bit 14.
    h = hn::Add(h, hn::And(h, hn::Set(du16, 0x4000)));
  }
  return hn::Mul(F16LanesToF32(df, h), factor);
}

// Encodes the lanes of `scaled` (moment times the block's encode factor).
template <MomentMap kMap, class DF>
HWY_INLINE void StoreMoment8(DF df, hn::Vec<DF> scaled, uint8_t* codes) {
  const hn::Rebind<uint8_t, DF> du8;
  const hn::Rebind<uint16_t, DF> du16;
  const auto h = F32ToF16BitsTrunc(df, scaled);
  hn::Vec<decltype(du16)> code;
  if constexpr (kMap == MomentMap::kSigned) {
    // Move the sign from bit 15 to bit 14 (the exponent's top bit is 0),
    // then round the 10-bit mantissa to 3 bits: +half a step, shift. The
    // carry of a rounding up moves into the exponent (or from a subnormal
    // to the smallest normal), never into the sign: |x| <= 1 + 2^-23.
    // (h - 0x4000 when the sign is set: 0x8000 becomes 0x4000.)
    const auto r = hn::Sub(h, hn::And(hn::ShiftRight<1>(h), hn::Set(du16, 0x4000)));
    code = hn::ShiftRight<7>(hn::Add(r, hn::Set(du16, 0x40)));
  } else {
    // Non-negative; never code 0 (moment_format.h).
    const auto a = hn::And(h, hn::Set(du16, 0x7FFF));
    code = hn::Max(hn::ShiftRight<7>(hn::Add(a, hn::Set(du16, 0x40))), hn::Set(du16, 1));
  }
  hn::StoreU(hn::TruncateTo(du8, code), du8, codes);
}

// Moment accessors. k is a compile-time constant at every call once the
// kernel body is inlined.
struct Fp32MomentIO {
  float* ptr[3];
  template <class D>
  HWY_INLINE hn::Vec<D> Load(D d, int k, size_t i) const {
    return hn::LoadU(d, ptr[k] + i);
  }
  template <class D>
  HWY_INLINE void Store(D d, int k, size_t i, hn::Vec<D> v) const {
    hn::StoreU(v, d, ptr[k] + i);
  }
};

struct Bf16MomentIO {
  uint16_t* ptr[3];  // at the step's element 0
  template <class D>
  HWY_INLINE hn::Vec<D> Load(D d, int k, size_t i) const {
    return LoadAsF32<DType::kBf16>(d, ptr[k], i);
  }
  template <class D>
  HWY_INLINE void Store(D d, int k, size_t i, hn::Vec<D> v) const {
    StoreFromF32<DType::kBf16>(d, v, ptr[k], i);
  }
};

template <MomentMap kMap0>
struct Blockwise8MomentIO {
  const uint8_t* codes[3];  // at the step's element 0
  float* stash[3];          // the block's new fp32 moments
  size_t block_begin;       // element of the step where the block starts
  float factor[3];          // the block's decode factors
  template <class D>
  HWY_INLINE hn::Vec<D> Load(D d, int k, size_t i) const {
    if (k == 0) return LoadMoment8<kMap0>(d, codes[0] + i, hn::Set(d, factor[0]));
    return LoadMoment8<MomentMap::kUnsigned>(d, codes[k] + i, hn::Set(d, factor[k]));
  }
  template <class D>
  HWY_INLINE void Store(D d, int k, size_t i, hn::Vec<D> v) const {
    hn::StoreU(v, d, stash[k] + (i - block_begin));
  }
};

// The stash of one block (n <= kMomentBlock new fp32 moments) -> its codes;
// returns the absmax to store. Same rules, bit for bit, as
// QuantizeMomentBlock8.
template <MomentMap kMap>
HWY_INLINE float FinishMomentBlock8(float* HWY_RESTRICT stash, size_t n, uint8_t* HWY_RESTRICT codes) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::CappedTag<float, 1> d1;
  const size_t lanes = hn::Lanes(df);
  // Whole vectors over the block, zeros after its last element (lanes
  // divides kMomentBlock, so the stash has room).
  const size_t padded = (n + lanes - 1) / lanes * lanes;
  for (size_t j = n; j < padded; ++j) stash[j] = 0.0f;
  // The largest magnitude by its bits: exact and order-free; NaN wins.
  auto max_bits = hn::Zero(du);
  for (size_t j = 0; j < padded; j += lanes) {
    max_bits = hn::Max(max_bits, hn::And(hn::BitCast(du, hn::Load(df, stash + j)),
                                         hn::Set(du, 0x7FFFFFFFu)));
  }
  const uint32_t bits = hn::GetLane(hn::MaxOfLanes(du, max_bits));
  uint32_t flush_bits;
  std::memcpy(&flush_bits, &kMomentFlushBelow, sizeof(flush_bits));
  if (bits >= 0x7F800000u || bits < flush_bits) {
    std::memset(codes, 0, n);
    return bits >= 0x7F800000u ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
  }
  float absmax;
  std::memcpy(&absmax, &bits, sizeof(absmax));
  const auto factor = hn::Set(df, Moment8EncodeFactor(absmax, kMap));
  size_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    StoreMoment8<kMap>(df, hn::Mul(hn::Load(df, stash + j), factor), codes + j);
  }
  const auto factor1 = hn::Set(d1, Moment8EncodeFactor(absmax, kMap));
  for (; j < n; ++j) StoreMoment8<kMap>(d1, hn::Mul(hn::LoadU(d1, stash + j), factor1), codes + j);
  return absmax;
}

// Runs element(d, i, mom) over [begin, end) of `spans` with the moments of
// spans.moment_format, writing the 16-bit param copy as ForEachStepLane
// does. kMap0: the map of the 8-bit exp_avg (kUnsigned for Adagrad's sum).
// REQUIRES: spans validated; for blockwise8, moment_offset + begin is a
// multiple of kMomentBlock and end is a block boundary or spans.size.
template <MomentFormat kFormat, MomentMap kMap0, bool kHasOut, DType kOut, class Element>
HWY_INLINE void ForEachMomentStep(const StepSpans& spans, size_t begin, size_t end,
                                  const Element& element) {
  if constexpr (kFormat == MomentFormat::kFp32) {
    const Fp32MomentIO mom{{spans.exp_avg, spans.exp_avg_sq, spans.max_exp_avg_sq}};
    ForEachStepLane<kHasOut, kOut>(begin, end, spans.param_out, [&](auto d, size_t i) STRATA_LANES {
      return element(d, i, mom);
    });
  } else if constexpr (kFormat == MomentFormat::kBf16) {
    const Bf16Moments& b = spans.bf16_moments;
    const size_t at = spans.moment_offset;
    auto base = [at](absl::Span<uint16_t> s) { return s.empty() ? nullptr : s.data() + at; };
    const Bf16MomentIO mom{{base(b.exp_avg), base(b.exp_avg_sq), base(b.max_exp_avg_sq)}};
    ForEachStepLane<kHasOut, kOut>(begin, end, spans.param_out, [&](auto d, size_t i) STRATA_LANES {
      return element(d, i, mom);
    });
  } else {
    const Blockwise8Moment* q[3] = {&spans.blockwise8_moments.exp_avg,
                                    &spans.blockwise8_moments.exp_avg_sq,
                                    &spans.blockwise8_moments.max_exp_avg_sq};
    const MomentMap maps[3] = {kMap0, MomentMap::kUnsigned, MomentMap::kUnsigned};
    const size_t at = spans.moment_offset;
    HWY_ALIGN float stash[3][kMomentBlock];
    Blockwise8MomentIO<kMap0> mom;
    bool used[3];
    for (int k = 0; k < 3; ++k) {
      used[k] = !q[k]->codes.empty();
      mom.codes[k] = used[k] ? q[k]->codes.data() + at : nullptr;
      mom.stash[k] = stash[k];
      mom.factor[k] = 0.0f;
    }
    for (size_t b = begin; b < end; b += kMomentBlock) {
      const size_t e = std::min(end, b + kMomentBlock);
      const size_t block = (at + b) / kMomentBlock;
      for (int k = 0; k < 3; ++k) {
        if (used[k]) mom.factor[k] = Moment8DecodeFactor(q[k]->absmax[block], maps[k]);
      }
      mom.block_begin = b;
      ForEachStepLane<kHasOut, kOut, /*kFence=*/false>(
          b, e, spans.param_out,
          [&](auto d, size_t i) STRATA_LANES { return element(d, i, mom); });
      uint8_t* codes[3];
      for (int k = 0; k < 3; ++k) codes[k] = used[k] ? q[k]->codes.data() + at + b : nullptr;
      if (used[0]) q[0]->absmax[block] = FinishMomentBlock8<kMap0>(stash[0], e - b, codes[0]);
      for (int k = 1; k < 3; ++k) {
        if (used[k]) {
          q[k]->absmax[block] = FinishMomentBlock8<MomentMap::kUnsigned>(stash[k], e - b, codes[k]);
        }
      }
    }
    if constexpr (kHasOut) hwy::FlushStream();  // the stream stores of every block
  }
}

// Calls fn(format) with the MomentFormat as a compile-time constant.
template <class Fn>
HWY_INLINE void WithMomentFormat(MomentFormat format, const Fn& fn) {
  switch (format) {
    case MomentFormat::kFp32:
      fn(std::integral_constant<MomentFormat, MomentFormat::kFp32>());
      break;
    case MomentFormat::kBf16:
      fn(std::integral_constant<MomentFormat, MomentFormat::kBf16>());
      break;
    case MomentFormat::kBlockwise8:
      fn(std::integral_constant<MomentFormat, MomentFormat::kBlockwise8>());
      break;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
