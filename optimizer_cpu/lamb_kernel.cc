// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"), as
// DeepSpeed's FusedLamb runs it (csrc/lamb/fused_lamb_cuda_kernel.cu), one
// Highway kernel per pass for every target and gradient/output dtype.
//
// The trust ratio ||p|| / ||update|| needs both norms over the whole tensor
// before any param may move, so a step is two passes:
//   moments: g *= scale; m = b1*m + (1-b1)*g; v = b2*v + ((1-b2)*g)*g;
//            update = m / (sqrt(v) + eps) + wd*p      (eps_inside_sqrt: sqrt(v + eps))
//            and the sums of p*p and update*update;
//   apply:   update recomputed from p, m, v exactly as above;
//            p += -(step_size * trust_ratio) * update; the 16-bit copy.
// The float operations and their order are reference_optimizer.cc's.
//
// The sums are in double (squares of floats are exact there) over 16
// "virtual lanes": element j of a range goes to accumulator j % 16, each
// accumulator adds in element order, and the 16 are added in index order.
// Every target maps its vectors onto those 16 lanes (AVX-512 one fp32 vector,
// AVX2 two, SSE4 four, scalar sixteen), so the sums are bit-identical on all
// targets and to the scalar reference.
#include <cstddef>

#include "optimizer_cpu/kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optimizer_cpu/lamb_kernel.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "optimizer_cpu/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace {

// The LAMB update of the lanes at element i, from the new moments and the
// param before the step.
template <class D>
HWY_INLINE hn::Vec<D> LambUpdate(D d, const StepScalars& s, hn::Vec<D> p, hn::Vec<D> m,
                                 hn::Vec<D> v) {
  const auto denom = s.eps_inside_sqrt ? hn::Sqrt(hn::Add(v, hn::Set(d, s.eps)))
                                       : hn::Add(hn::Sqrt(v), hn::Set(d, s.eps));
  auto update = hn::Div(m, denom);
  if (s.weight_decay != 0.0f) update = hn::Add(update, hn::Mul(hn::Set(d, s.weight_decay), p));
  return update;
}

// The pointers of pass 1, copied out of StepSpans so that the compiler keeps
// them in registers.
struct MomentsPointers {
  const void* grad;
  float* HWY_RESTRICT params;
  float* HWY_RESTRICT exp_avg;
  float* HWY_RESTRICT exp_avg_sq;
};

// Pass 1 over the lanes at element i: new moments stored; p and the update
// returned for the norms.
template <DType kGrad, class D>
HWY_INLINE void LambMomentsLanes(D d, const StepScalars& s, const MomentsPointers& ptr, size_t i,
                                 hn::Vec<D>& p, hn::Vec<D>& update) {
  auto g = hn::Mul(LoadAsF32<kGrad>(d, ptr.grad, i), hn::Set(d, s.grad_scale));
  if (s.maximize) g = hn::Neg(g);
  p = hn::LoadU(d, ptr.params + i);
  const auto m = hn::Add(hn::Mul(hn::LoadU(d, ptr.exp_avg + i), hn::Set(d, s.beta1)),
                         hn::Mul(g, hn::Set(d, s.one_minus_beta1)));
  const auto v = hn::Add(hn::Mul(hn::LoadU(d, ptr.exp_avg_sq + i), hn::Set(d, s.beta2)),
                         hn::Mul(hn::Mul(hn::Set(d, s.one_minus_beta2), g), g));
  hn::StoreU(m, d, ptr.exp_avg + i);
  hn::StoreU(v, d, ptr.exp_avg_sq + i);
  update = LambUpdate(d, s, p, m, v);
}

template <DType kGrad>
LambNorms LambMomentsTyped(const StepScalars& scalars, const StepSpans& spans, size_t begin,
                           size_t end) {
  const StepScalars s = scalars;  // a local copy stays in registers (see AdamTyped)
  const MomentsPointers ptr{spans.grad, spans.params, spans.exp_avg, spans.exp_avg_sq};
  const hn::ScalableTag<float> df;
  const hn::CappedTag<float, 1> d1;
  constexpr size_t kN = hn::MaxLanes(df);
  static_assert(kLambNormLanes % kN == 0, "an fp32 vector must divide the 16 norm lanes");
  double p_sums[kLambNormLanes] = {};
  double u_sums[kLambNormLanes] = {};
  size_t i = begin;
#if HWY_TARGET == HWY_SCALAR
  {
    // Highway's portable scalar target: one double per lane.
    const hn::Rebind<double, decltype(df)> dd;
    for (; i + kLambNormLanes <= end; i += kLambNormLanes) {
      for (size_t k = 0; k < kLambNormLanes; ++k) {
        hn::Vec<decltype(df)> p, u;
        LambMomentsLanes<kGrad>(df, s, ptr, i + k, p, u);
        const auto pd = hn::PromoteTo(dd, p);
        const auto ud = hn::PromoteTo(dd, u);
        p_sums[k] += hn::GetLane(hn::Mul(pd, pd));
        u_sums[k] += hn::GetLane(hn::Mul(ud, ud));
      }
    }
  }
#else
  {
    // Each fp32 vector is two double vectors (its lower and upper half).
    const hn::Half<decltype(df)> dh;
    const hn::Rebind<double, decltype(dh)> dd;
    constexpr size_t kHalf = kN / 2;
    constexpr size_t kVectors = kLambNormLanes / kN;  // fp32 vectors per 16 elements
    hn::Vec<decltype(dd)> p_acc[2 * kVectors];
    hn::Vec<decltype(dd)> u_acc[2 * kVectors];
    for (size_t a = 0; a < 2 * kVectors; ++a) {
      p_acc[a] = hn::Zero(dd);
      u_acc[a] = hn::Zero(dd);
    }
    auto add = [&](hn::Vec<decltype(dd)>& acc, hn::Vec<decltype(dh)> x) STRATA_LANES {
      const auto xd = hn::PromoteTo(dd, x);
      acc = hn::Add(acc, hn::Mul(xd, xd));
    };
    for (; i + kLambNormLanes <= end; i += kLambNormLanes) {
      for (size_t k = 0; k < kVectors; ++k) {
        hn::Vec<decltype(df)> p, u;
        LambMomentsLanes<kGrad>(df, s, ptr, i + k * kN, p, u);
        add(p_acc[2 * k], hn::LowerHalf(dh, p));
        add(p_acc[2 * k + 1], hn::UpperHalf(dh, p));
        add(u_acc[2 * k], hn::LowerHalf(dh, u));
        add(u_acc[2 * k + 1], hn::UpperHalf(dh, u));
      }
    }
    for (size_t a = 0; a < 2 * kVectors; ++a) {
      hn::StoreU(p_acc[a], dd, p_sums + a * kHalf);
      hn::StoreU(u_acc[a], dd, u_sums + a * kHalf);
    }
  }
#endif
  // The last partial group of 16, one lane at a time, into the same lanes.
  for (size_t k = 0; i < end; ++i, ++k) {
    hn::Vec<decltype(d1)> p, u;
    LambMomentsLanes<kGrad>(d1, s, ptr, i, p, u);
    const double pd = hn::GetLane(p);
    const double ud = hn::GetLane(u);
    p_sums[k] += pd * pd;
    u_sums[k] += ud * ud;
  }
  LambNorms norms;
  for (size_t k = 0; k < kLambNormLanes; ++k) {
    norms.param_sq += p_sums[k];
    norms.update_sq += u_sums[k];
  }
  return norms;
}

template <bool kHasOut, DType kOut>
void LambApplyTyped(const StepScalars& scalars, const StepSpans& spans, size_t begin, size_t end) {
  const StepScalars s = scalars;
  float* HWY_RESTRICT params = spans.params;
  const float* HWY_RESTRICT exp_avg = spans.exp_avg;
  const float* HWY_RESTRICT exp_avg_sq = spans.exp_avg_sq;
  auto element = [&](auto d, size_t i) STRATA_LANES {
    auto p = hn::LoadU(d, params + i);
    const auto update = LambUpdate(d, s, p, hn::LoadU(d, exp_avg + i), hn::LoadU(d, exp_avg_sq + i));
    p = hn::Add(p, hn::Mul(hn::Set(d, s.neg_step_size), update));
    hn::StoreU(p, d, params + i);
    return p;
  };
  ForEachStepLane<kHasOut, kOut>(begin, end, spans.param_out, element);
}

}  // namespace

LambNorms LambMomentsRangeT(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end) {
  LambNorms norms;
  WithDType(spans.grad_dtype, [&](auto grad) {
    norms = LambMomentsTyped<decltype(grad)::value>(s, spans, begin, end);
  });
  return norms;
}

void LambApplyRangeT(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end) {
  WithStepDTypes(DType::kFp32, spans.param_out_dtype, [&](auto, auto has_out, auto out) {
    LambApplyTyped<decltype(has_out)::value, decltype(out)::value>(s, spans, begin, end);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {
HWY_EXPORT(LambMomentsRangeT);
HWY_EXPORT(LambApplyRangeT);

namespace internal {
LambNorms LambMomentsRange(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end) {
  return HWY_DYNAMIC_DISPATCH(LambMomentsRangeT)(s, spans, begin, end);
}
void LambApplyRange(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end) {
  HWY_DYNAMIC_DISPATCH(LambApplyRangeT)(s, spans, begin, end);
}
}  // namespace internal
}  // namespace strata
#endif  // HWY_ONCE
