// Lion (Chen et al. 2023, Algorithm 2; lucidrains/lion-pytorch's update_fn),
// one Highway kernel for every target and gradient/output dtype:
//   p *= 1 - lr * wd;  p += -lr * sign(beta1 * m + (1 - beta1) * g);
//   m = beta2 * m + (1 - beta2) * g
// sign(0) is 0 and sign(NaN) is NaN, so a NaN gradient poisons the param as
// it would in torch instead of being silently treated as a direction.
#include <cstddef>

#include "optimizer_cpu/kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optimizer_cpu/lion_kernel.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "optimizer_cpu/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace {

template <DType kGrad, bool kHasOut, DType kOut>
void LionTyped(const StepScalars& scalars, const StepSpans& spans, size_t begin, size_t end) {
  const StepScalars s = scalars;  // see AdamTyped
  const void* grad = spans.grad;
  float* HWY_RESTRICT params = spans.params;
  float* HWY_RESTRICT exp_avg = spans.exp_avg;
  auto element = [&](auto d, size_t i) STRATA_LANES {
    auto g = hn::Mul(LoadAsF32<kGrad>(d, grad, i), hn::Set(d, s.grad_scale));
    if (s.maximize) g = hn::Neg(g);
    auto p = hn::Mul(hn::LoadU(d, params + i), hn::Set(d, s.decay_factor));
    const auto m = hn::LoadU(d, exp_avg + i);
    const auto c = hn::Add(hn::Mul(m, hn::Set(d, s.beta1)), hn::Mul(g, hn::Set(d, s.one_minus_beta1)));
    const auto zero = hn::Zero(d);
    // +1, -1, or c itself for +-0 and NaN.
    const auto update = hn::IfThenElse(hn::Gt(c, zero), hn::Set(d, 1.0f),
                                       hn::IfThenElse(hn::Lt(c, zero), hn::Set(d, -1.0f), c));
    p = hn::Add(p, hn::Mul(hn::Set(d, s.neg_step_size), update));
    const auto m_new = hn::Add(hn::Mul(m, hn::Set(d, s.beta2)), hn::Mul(g, hn::Set(d, s.one_minus_beta2)));
    hn::StoreU(m_new, d, exp_avg + i);
    hn::StoreU(p, d, params + i);
    return p;
  };
  ForEachStepLane<kHasOut, kOut>(begin, end, spans.param_out, element);
}

}  // namespace

void LionRangeT(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end) {
  WithStepDTypes(spans.grad_dtype, spans.param_out_dtype, [&](auto grad, auto has_out, auto out) {
    LionTyped<decltype(grad)::value, decltype(has_out)::value, decltype(out)::value>(s, spans, begin, end);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {
HWY_EXPORT(LionRangeT);

namespace internal {
void LionRange(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end) {
  HWY_DYNAMIC_DISPATCH(LionRangeT)(s, spans, begin, end);
}
}  // namespace internal
}  // namespace strata
#endif  // HWY_ONCE
