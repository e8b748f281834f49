// The vectorized helpers mixed-precision training needs around a step:
// inf/NaN detection over gradients (skip the step when the loss scale
// overflowed), the squared L2 norm (global-norm clipping across shards), and
// whole-buffer fp16/bf16 <-> fp32 conversion.
#include <cstddef>
#include <cstdint>

#include "optimizer_cpu/kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optimizer_cpu/grad_kernels.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "optimizer_cpu/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace {

// A value is inf or NaN exactly when its exponent bits are all ones, so the
// check runs on the raw bits (no conversion) of `T` lanes.
template <class D>
bool AnyExponentAllOnes(D d, const hn::TFromD<D>* HWY_RESTRICT bits, size_t begin, size_t end,
                        hn::TFromD<D> exp_mask) {
  const auto mask = hn::Set(d, exp_mask);
  const size_t n = hn::Lanes(d);
  size_t i = begin;
  auto found = hn::Zero(d);
  for (; i + n <= end; i += n) {
    const auto e = hn::And(hn::LoadU(d, bits + i), mask);
    found = hn::Or(found, hn::VecFromMask(d, hn::Eq(e, mask)));
  }
  bool any = !hn::AllFalse(d, hn::Ne(found, hn::Zero(d)));
  for (; i < end; ++i) any |= (bits[i] & exp_mask) == exp_mask;
  return any;
}

}  // namespace

bool HasInfOrNanRangeT(const GradView& grad, size_t begin, size_t end) {
  if (grad.dtype == DType::kFp32) {
    const hn::ScalableTag<uint32_t> d;
    return AnyExponentAllOnes(d, static_cast<const uint32_t*>(grad.data), begin, end,
                              0x7F800000u);
  }
  const hn::ScalableTag<uint16_t> d;
  const uint16_t exp_mask = grad.dtype == DType::kFp16 ? 0x7C00 : 0x7F80;
  return AnyExponentAllOnes(d, static_cast<const uint16_t*>(grad.data), begin, end, exp_mask);
}

double SquaredL2NormRangeT(const GradView& grad, size_t begin, size_t end) {
  // Squares of fp32 values are exact in double, and double accumulation keeps
  // the sum of 1e8 fp16 gradients (up to 65504^2 each) far from overflow and
  // its rounding error below fp32's.
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;  // half-width fp32 lanes
  const hn::CappedTag<double, 1> dd1;
  const hn::Rebind<float, decltype(dd1)> df1;
  double total = 0.0;
  WithDType(grad.dtype, [&](auto dtype) {
    constexpr DType kType = decltype(dtype)::value;
    const size_t n = hn::Lanes(dd);
    auto acc0 = hn::Zero(dd);
    auto acc1 = hn::Zero(dd);
    size_t i = begin;
    for (; i + 2 * n <= end; i += 2 * n) {
      const auto a = hn::PromoteTo(dd, LoadAsF32<kType>(df, grad.data, i));
      const auto b = hn::PromoteTo(dd, LoadAsF32<kType>(df, grad.data, i + n));
      acc0 = hn::Add(acc0, hn::Mul(a, a));
      acc1 = hn::Add(acc1, hn::Mul(b, b));
    }
    for (; i + n <= end; i += n) {
      const auto a = hn::PromoteTo(dd, LoadAsF32<kType>(df, grad.data, i));
      acc0 = hn::Add(acc0, hn::Mul(a, a));
    }
    total = hn::GetLane(hn::SumOfLanes(dd, hn::Add(acc0, acc1)));
    for (; i < end; ++i) {
      const auto a = hn::PromoteTo(dd1, LoadAsF32<kType>(df1, grad.data, i));
      total += hn::GetLane(hn::Mul(a, a));
    }
  });
  return total;
}

void ToFp32RangeT(const void* src, DType src_dtype, float* dst, size_t begin, size_t end) {
  WithDType(src_dtype, [&](auto dtype) {
    ForEachLane(begin, end, [&](auto d, size_t i) HWY_ATTR {
      hn::StoreU(LoadAsF32<decltype(dtype)::value>(d, src, i), d, dst + i);
    });
  });
}

void FromFp32RangeT(const float* src, void* dst, DType dst_dtype, size_t begin, size_t end) {
  WithDType(dst_dtype, [&](auto dtype) {
    ForEachLane(begin, end, [&](auto d, size_t i) HWY_ATTR {
      StoreFromF32<decltype(dtype)::value>(d, hn::LoadU(d, src + i), dst, i);
    });
  });
}

const char* TargetNameT() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {
HWY_EXPORT(HasInfOrNanRangeT);
HWY_EXPORT(SquaredL2NormRangeT);
HWY_EXPORT(ToFp32RangeT);
HWY_EXPORT(FromFp32RangeT);
HWY_EXPORT(TargetNameT);

namespace internal {
bool HasInfOrNanRange(const GradView& grad, size_t begin, size_t end) {
  return HWY_DYNAMIC_DISPATCH(HasInfOrNanRangeT)(grad, begin, end);
}
double SquaredL2NormRange(const GradView& grad, size_t begin, size_t end) {
  return HWY_DYNAMIC_DISPATCH(SquaredL2NormRangeT)(grad, begin, end);
}
void ToFp32Range(const void* src, DType src_dtype, float* dst, size_t begin, size_t end) {
  HWY_DYNAMIC_DISPATCH(ToFp32RangeT)(src, src_dtype, dst, begin, end);
}
void FromFp32Range(const float* src, void* dst, DType dst_dtype, size_t begin, size_t end) {
  HWY_DYNAMIC_DISPATCH(FromFp32RangeT)(src, dst, dst_dtype, begin, end);
}
const char* ActiveTargetName() { return HWY_DYNAMIC_DISPATCH(TargetNameT)(); }
}  // namespace internal
}  // namespace strata
#endif  // HWY_ONCE
