// Adam and AdamW, one Highway kernel for every target and gradient/output
// dtype. Each element: load the gradient (any dtype) and scale it, apply L2
// (Adam) or decoupled (AdamW) weight decay, update both moments, optionally
// the AMSGrad max, then the param, and write the 16-bit copy -- one pass over
// memory. The float operations and their order are those of
// reference_optimizer.cc and of torch.optim.Adam(W) (_single_tensor_adam),
// except that sqrt(v) is multiplied by 1/sqrt(1 - beta2^t) instead of being
// divided by sqrt(1 - beta2^t) (see StepScalars::inv_bias_correction2_sqrt).
#include <cstddef>

#include "optimizer_cpu/kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optimizer_cpu/adam_kernel.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "optimizer_cpu/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace {

template <DType kGrad, bool kHasOut, DType kOut>
void AdamTyped(const StepScalars& scalars, const StepSpans& spans, size_t begin, size_t end) {
  // A local copy: stores through the float spans cannot alias it, so the
  // compiler keeps the broadcast constants in registers across the loop.
  const StepScalars s = scalars;
  const bool l2 = s.weight_decay != 0.0f;
  const void* grad = spans.grad;
  float* HWY_RESTRICT params = spans.params;
  float* HWY_RESTRICT exp_avg = spans.exp_avg;
  float* HWY_RESTRICT exp_avg_sq = spans.exp_avg_sq;
  float* HWY_RESTRICT max_sq = spans.max_exp_avg_sq;
  auto element = [&](auto d, size_t i) STRATA_LANES {
    auto g = hn::Mul(LoadAsF32<kGrad>(d, grad, i), hn::Set(d, s.grad_scale));
    if (s.maximize) g = hn::Neg(g);
    auto p = hn::LoadU(d, params + i);
    if (l2) g = hn::Add(g, hn::Mul(hn::Set(d, s.weight_decay), p));
    p = hn::Mul(p, hn::Set(d, s.decay_factor));
    const auto m = hn::Add(hn::Mul(hn::LoadU(d, exp_avg + i), hn::Set(d, s.beta1)),
                           hn::Mul(g, hn::Set(d, s.one_minus_beta1)));
    const auto v = hn::Add(hn::Mul(hn::LoadU(d, exp_avg_sq + i), hn::Set(d, s.beta2)),
                           hn::Mul(hn::Mul(hn::Set(d, s.one_minus_beta2), g), g));
    auto v_hat = v;
    if (s.amsgrad) {
      // torch.maximum: NaN in either operand wins.
      const auto old = hn::LoadU(d, max_sq + i);
      v_hat = hn::IfThenElse(hn::Or(hn::Gt(v, old), hn::IsNaN(v)), v, old);
      v_hat = hn::IfThenElse(hn::IsNaN(old), old, v_hat);
      hn::StoreU(v_hat, d, max_sq + i);
    }
    const auto denom = hn::Add(hn::Mul(hn::Sqrt(v_hat), hn::Set(d, s.inv_bias_correction2_sqrt)),
                               hn::Set(d, s.eps));
    p = hn::Add(p, hn::Mul(hn::Set(d, s.neg_step_size), hn::Div(m, denom)));
    hn::StoreU(m, d, exp_avg + i);
    hn::StoreU(v, d, exp_avg_sq + i);
    hn::StoreU(p, d, params + i);
    return p;
  };
  ForEachStepLane<kHasOut, kOut>(begin, end, spans.param_out, element);
}

}  // namespace

void AdamRangeT(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end) {
  WithStepDTypes(spans.grad_dtype, spans.param_out_dtype, [&](auto grad, auto has_out, auto out) {
    AdamTyped<decltype(grad)::value, decltype(has_out)::value, decltype(out)::value>(s, spans, begin, end);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {
HWY_EXPORT(AdamRangeT);

namespace internal {
void AdamRange(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end) {
  HWY_DYNAMIC_DISPATCH(AdamRangeT)(s, spans, begin, end);
}
}  // namespace internal
}  // namespace strata
#endif  // HWY_ONCE
