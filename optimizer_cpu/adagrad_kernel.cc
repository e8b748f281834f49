// Adagrad, one Highway kernel for every target and gradient/output dtype, in
// the float operation order of torch.optim.Adagrad (_single_tensor_adagrad,
// dense gradients) and reference_optimizer.cc:
//   g += wd * p;  sum += g * g;  p += -clr * (g / (sqrt(sum) + eps))
// The sum of squares lives in StepSpans::exp_avg.
#include <cstddef>

#include "optimizer_cpu/kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optimizer_cpu/adagrad_kernel.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "optimizer_cpu/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace strata {
namespace HWY_NAMESPACE {
namespace {

template <DType kGrad, bool kHasOut, DType kOut>
void AdagradTyped(const StepScalars& scalars, const StepSpans& spans, size_t begin, size_t end) {
  const StepScalars s = scalars;  // see AdamTyped
  const bool l2 = s.weight_decay != 0.0f;
  const void* grad = spans.grad;
  float* HWY_RESTRICT params = spans.params;
  float* HWY_RESTRICT sum_sq = spans.exp_avg;
  auto element = [&](auto d, size_t i) STRATA_LANES {
    auto g = hn::Mul(LoadAsF32<kGrad>(d, grad, i), hn::Set(d, s.grad_scale));
    if (s.maximize) g = hn::Neg(g);
    auto p = hn::LoadU(d, params + i);
    if (l2) g = hn::Add(g, hn::Mul(hn::Set(d, s.weight_decay), p));
    const auto sum = hn::Add(hn::LoadU(d, sum_sq + i), hn::Mul(g, g));
    const auto std_dev = hn::Add(hn::Sqrt(sum), hn::Set(d, s.eps));
    p = hn::Add(p, hn::Mul(hn::Set(d, s.neg_step_size), hn::Div(g, std_dev)));
    hn::StoreU(sum, d, sum_sq + i);
    hn::StoreU(p, d, params + i);
    return p;
  };
  ForEachStepLane<kHasOut, kOut>(begin, end, spans.param_out, element);
}

}  // namespace

void AdagradRangeT(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end) {
  WithStepDTypes(spans.grad_dtype, spans.param_out_dtype, [&](auto grad, auto has_out, auto out) {
    AdagradTyped<decltype(grad)::value, decltype(has_out)::value, decltype(out)::value>(s, spans, begin, end);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace strata
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace strata {
HWY_EXPORT(AdagradRangeT);

namespace internal {
void AdagradRange(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end) {
  HWY_DYNAMIC_DISPATCH(AdagradRangeT)(s, spans, begin, end);
}
}  // namespace internal
}  // namespace strata
#endif  // HWY_ONCE
