// Per-target vector loads and stores of fp16 / bf16 / fp32 lanes, with the
// rounding contract of half.h on every Highway target.
//
// Why not Highway's PromoteTo/DemoteTo everywhere: in Highway 1.0.3 the
// non-F16C fp16 paths (SSE4, SSSE3, emulation) truncate and mishandle inf and
// NaN, and the bf16 demotion truncates on every target. So: fp16 uses F16C
// (vcvtph2ps / vcvtps2ph, round to nearest even) where the target has it and
// integer code otherwise; bf16 is integer round-to-nearest-even everywhere,
// which keeps it vectorized on AVX2 (DeepSpeed falls back to scalar there).
//
// Included once per target by foreach_target.h, hence the toggle guard.
#if defined(STRATA_OPTIMIZER_CPU_HALF_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef STRATA_OPTIMIZER_CPU_HALF_INL_H_
#undef STRATA_OPTIMIZER_CPU_HALF_INL_H_
#else
#define STRATA_OPTIMIZER_CPU_HALF_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

#include "core/dtype.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// For the per-element lambdas of the kernels: compiled for this target and
// always inlined into the lane loops. Left to itself GCC kept the AdamW body
// out of line, one call per vector, reloading every pointer and scalar
// through the captured references: about 40 instructions of overhead per
// 8 elements on AVX2, which made the 16-bit paths compute-bound there.
#define STRATA_LANES HWY_ATTR __attribute__((always_inline))

// Targets whose fp16 conversions are the F16C instructions.
constexpr bool kHaveF16C =
    HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL;

// fp16 bits (zero-extended in u32 lanes) -> fp32, exact.
template <class DF>
HWY_INLINE hn::Vec<DF> F16BitsToF32(DF df, hn::Vec<hn::RebindToUnsigned<DF>> h) {
  const hn::RebindToUnsigned<DF> du;
  // Giesen's half_to_float: move exponent+mantissa into place, rebias, then
  // fix up inf/NaN (exponent 31) and zero/subnormal (exponent 0).
  auto o = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7FFFu)));
  const auto exp = hn::And(o, hn::Set(du, 0x0F800000u));
  o = hn::Add(o, hn::Set(du, 112u << 23));
  const auto is_inf_nan = hn::Eq(exp, hn::Set(du, 0x0F800000u));
  // Inf/NaN: exponent all ones; a NaN also gets the quiet bit, as F16C does.
  const auto nan_quiet = hn::IfThenElseZero(
      hn::Ne(hn::And(h, hn::Set(du, 0x3FFu)), hn::Zero(du)), hn::Set(du, 0x00400000u));
  o = hn::IfThenElse(is_inf_nan, hn::Or(hn::Add(o, hn::Set(du, 112u << 23)), nan_quiet), o);
  // Subnormal: (mantissa as the low bits of 2^-14's binade) - 2^-14, exact.
  const auto sub = hn::Sub(hn::BitCast(df, hn::Add(o, hn::Set(du, 1u << 23))),
                           hn::BitCast(df, hn::Set(du, 113u << 23)));
  o = hn::IfThenElse(hn::Eq(exp, hn::Zero(du)), hn::BitCast(du, sub), o);
  o = hn::Or(o, hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u))));
  return hn::BitCast(df, o);
}

// fp32 -> fp16 bits in u32 lanes, round to nearest even, NaN -> sign|0x7E00,
// overflow -> inf. Giesen's float_to_half_fast3_rtne, vectorized.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> F32ToF16Bits(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto bits = hn::BitCast(du, v);
  const auto sign = hn::And(bits, hn::Set(du, 0x80000000u));
  const auto abs = hn::Xor(bits, sign);  // < 2^31: signed compares are safe
  const auto abs_i = hn::BitCast(di, abs);
  const auto inf_nan = hn::IfThenElse(
      hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, 0x7F800000))), hn::Set(du, 0x7E00u),
      hn::Set(du, 0x7C00u));
  // Subnormal results: adding 0.5 (exponent 126) aligns the value so that the
  // FPU's round-to-nearest-even does the rounding; subtracting its bits
  // leaves the fp16 mantissa.
  const auto magic = hn::Set(du, 126u << 23);
  const auto sub = hn::Sub(hn::BitCast(du, hn::Add(hn::BitCast(df, abs), hn::BitCast(df, magic))),
                           magic);
  // Normal results: rebias, add 0xFFF plus the lowest kept bit (ties to even),
  // shift out the 13 dropped bits. A carry rounds up into the exponent.
  const auto mant_odd = hn::And(hn::ShiftRight<13>(abs), hn::Set(du, 1u));
  const auto normal = hn::ShiftRight<13>(
      hn::Add(hn::Add(abs, hn::Set(du, 0xC8000FFFu)), mant_odd));  // -(112<<23) + 0xFFF
  auto o = hn::IfThenElse(hn::RebindMask(du, hn::Lt(abs_i, hn::Set(di, 113 << 23))), sub, normal);
  o = hn::IfThenElse(hn::RebindMask(du, hn::Gt(abs_i, hn::Set(di, (143 << 23) - 1))), inf_nan, o);
  return hn::Or(o, hn::ShiftRight<16>(sign));
}

// fp32 -> bf16 bits in u32 lanes: round to nearest even; NaN -> 0xFFFF.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> F32ToBf16Bits(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(hn::Add(bits, hn::Set(du, 0x7FFFu)), lsb));
  (void)df;
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Set(du, 0xFFFFu), rounded);
}

// Loads Lanes(df) elements starting at element i of a buffer of dtype kType.
template <DType kType, class DF>
HWY_INLINE hn::Vec<DF> LoadAsF32(DF df, const void* base, size_t i) {
  if constexpr (kType == DType::kFp32) {
    return hn::LoadU(df, static_cast<const float*>(base) + i);
  } else {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::RebindToUnsigned<DF> du;
    const uint16_t* p = static_cast<const uint16_t*>(base) + i;
    if constexpr (kType == DType::kBf16) {
      return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(du16, p))));
    } else {
      if constexpr (kHaveF16C) {
        const hn::Rebind<hwy::float16_t, DF> df16;
        return hn::PromoteTo(df, hn::LoadU(df16, reinterpret_cast<const hwy::float16_t*>(p)));
      } else {
        return F16BitsToF32(df, hn::PromoteTo(du, hn::LoadU(du16, p)));
      }
    }
  }
}

// The Lanes(df) values of v as fp16 or bf16 bits (kType), in u16 lanes.
template <DType kType, class DF>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> ToHalfBits(DF df, hn::Vec<DF> v) {
  static_assert(kType != DType::kFp32);
  const hn::Rebind<uint16_t, DF> du16;
  const hn::RebindToSigned<DF> di;
  if constexpr (kType == DType::kBf16) {
    return hn::DemoteTo(du16, hn::BitCast(di, F32ToBf16Bits(df, v)));
  } else if constexpr (kHaveF16C) {
    // vcvtps2ph keeps NaN payloads; torch writes sign|0x7E00. Replace NaNs
    // by the quiet NaN with an empty payload, which converts to exactly that.
    const hn::RebindToUnsigned<DF> du;
    const auto canonical = hn::BitCast(
        df, hn::Or(hn::And(hn::BitCast(du, v), hn::Set(du, 0x80000000u)), hn::Set(du, 0x7FC00000u)));
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::BitCast(du16, hn::DemoteTo(df16, hn::IfThenElse(hn::IsNaN(v), canonical, v)));
  } else {
    return hn::DemoteTo(du16, hn::BitCast(di, F32ToF16Bits(df, v)));
  }
}

// Stores the Lanes(df) values of v at element i of a buffer of dtype kType.
template <DType kType, class DF>
HWY_INLINE void StoreFromF32(DF df, hn::Vec<DF> v, void* base, size_t i) {
  if constexpr (kType == DType::kFp32) {
    hn::StoreU(v, df, static_cast<float*>(base) + i);
  } else {
    const hn::Rebind<uint16_t, DF> du16;
    hn::StoreU(ToHalfBits<kType>(df, v), du16, static_cast<uint16_t*>(base) + i);
  }
}

// Calls body(d, i) for every vector of [begin, end), then for each remaining
// element with a one-lane tag, so tails run the same arithmetic as the body.
template <class Body>
HWY_INLINE void ForEachLane(size_t begin, size_t end, const Body& body) {
  const hn::ScalableTag<float> df;
  const size_t n = hn::Lanes(df);
  size_t i = begin;
  for (; i + 2 * n <= end; i += 2 * n) {
    body(df, i);
    body(df, i + n);
  }
  for (; i + n <= end; i += n) body(df, i);
  const hn::CappedTag<float, 1> d1;
  for (; i < end; ++i) body(d1, i);
}

// Whether the 16-bit copy of the params goes out with non-temporal stores.
// It is written and not read back by the CPU (it goes to the GPU), and a
// plain store first reads each cache line it writes (write-allocate): 2 more
// bytes per element on top of the 28 an fp16 AdamW step moves.
//
// The copy of two fp32 vectors is one full u16 vector (Combine), and the
// stores are lined up so that each 64-byte line is written whole by
// back-to-back stores: 64-byte zmm stores on AVX-512, two 32-byte ymm stores
// on AVX2, four 16-byte stores on SSE4/SSSE3. Storing the u16 half of one
// fp32 vector at a time (16 bytes on AVX2) left partly written lines in the
// write-combining buffers between the other streams' accesses, and SSE4 had
// no stream stores at all. Not on Highway's portable scalar target (one-lane
// vectors).
#undef STRATA_STREAM_HALF_OUT  // one value per target
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
#define STRATA_STREAM_HALF_OUT 1
#else
#define STRATA_STREAM_HALF_OUT 0
#endif
constexpr size_t kCacheLineBytes = 64;

// Runs an optimizer's per-element body over [begin, end). element(d, i)
// updates the lanes of d at element i (params and states in place) and
// returns the updated fp32 params; when kHasOut, this loop writes their
// kOut (fp16/bf16) copy to param_out: non-temporal for the lines of
// param_out that the range covers whole (after single lanes up to the first
// line boundary), plain stores for the rest. The stream stores are fenced
// before returning, so they are ordered before whatever the caller does next
// (e.g. the pool's completion signal).
template <bool kHasOut, DType kOut, class Element>
HWY_INLINE void ForEachStepLane(size_t begin, size_t end, void* param_out, const Element& element) {
  if constexpr (!kHasOut) {
    ForEachLane(begin, end, [&](auto d, size_t i) STRATA_LANES { (void)element(d, i); });
  } else {
    auto plain = [&](auto d, size_t i) STRATA_LANES {
      StoreFromF32<kOut>(d, element(d, i), param_out, i);
    };
    const uintptr_t addr = reinterpret_cast<uintptr_t>(param_out) + begin * sizeof(uint16_t);
    // A 16-bit buffer at an odd address never reaches vector alignment.
    if (!STRATA_STREAM_HALF_OUT || addr % sizeof(uint16_t) != 0) {
      ForEachLane(begin, end, plain);
      return;
    }
#if STRATA_STREAM_HALF_OUT
    {
      const hn::ScalableTag<float> df;
      const hn::Repartition<uint16_t, decltype(df)> du16;  // 2 * Lanes(df) lanes
      const hn::CappedTag<float, 1> d1;
      const size_t n = hn::Lanes(df);
      uint16_t* out = static_cast<uint16_t*>(param_out);
      // Two fp32 vectors -> one full u16 vector, stored non-temporally.
      auto pair = [&](size_t i) STRATA_LANES {
        const auto lo = ToHalfBits<kOut>(df, element(df, i));
        const auto hi = ToHalfBits<kOut>(df, element(df, i + n));
        hn::Stream(hn::Combine(du16, hi, lo), du16, out + i);
      };
      const size_t peel = std::min(
          end - begin, (kCacheLineBytes - addr % kCacheLineBytes) % kCacheLineBytes / sizeof(uint16_t));
      size_t i = begin;
      for (; i < begin + peel; ++i) plain(d1, i);
      // A line is 32 / n pairs (AVX-512 one, AVX2 two, SSE4 four): the
      // pairs of a line are stored back to back.
      constexpr size_t kPairsPerLine = kCacheLineBytes / (2 * sizeof(uint16_t) * hn::MaxLanes(df));
      constexpr size_t kGroup = kPairsPerLine < 1 ? 1 : kPairsPerLine;
      for (; i + kGroup * 2 * n <= end; i += kGroup * 2 * n) {
        for (size_t k = 0; k < kGroup; ++k) pair(i + k * 2 * n);
      }
      for (; i + n <= end; i += n) plain(df, i);
      for (; i < end; ++i) plain(d1, i);
      hwy::FlushStream();
    }
#endif
  }
}

// Dispatches a DType known at runtime to a template argument.
template <class Fn>
HWY_INLINE void WithDType(DType dtype, const Fn& fn) {
  switch (dtype) {
    case DType::kFp32:
      fn(std::integral_constant<DType, DType::kFp32>());
      break;
    case DType::kFp16:
      fn(std::integral_constant<DType, DType::kFp16>());
      break;
    case DType::kBf16:
      fn(std::integral_constant<DType, DType::kBf16>());
      break;
  }
}

// Calls kernel(grad, has_out, out) with compile-time constants for a step's
// gradient dtype and optional 16-bit param dtype.
template <class Kernel>
HWY_INLINE void WithStepDTypes(DType grad_dtype, std::optional<DType> out_dtype, const Kernel& kernel) {
  WithDType(grad_dtype, [&](auto grad) {
    if (!out_dtype.has_value()) {
      kernel(grad, std::false_type(), std::integral_constant<DType, DType::kFp32>());
    } else if (*out_dtype == DType::kFp16) {
      kernel(grad, std::true_type(), std::integral_constant<DType, DType::kFp16>());
    } else {
      kernel(grad, std::true_type(), std::integral_constant<DType, DType::kBf16>());
    }
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
