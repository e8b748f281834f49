#include "optimizer_cpu/reference_optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/status_macros.h"
#include "optimizer_cpu/half.h"

namespace strata {
namespace {

// torch.maximum: NaN in either operand propagates.
float NanMax(float a, float b) {
  if (std::isnan(a)) return a;
  if (b > a || std::isnan(b)) return b;
  return a;
}

// torch.sign, keeping NaN (and the sign of zero, which does not matter:
// -lr * +-0 leaves p unchanged either way).
float Sign(float x) {
  if (x > 0.0f) return 1.0f;
  if (x < 0.0f) return -1.0f;
  return x;
}

float LoadGrad(const StepScalars& s, const StepSpans& spans, size_t i) {
  float g = ReferenceLoad(spans.grad, spans.grad_dtype, i) * s.grad_scale;
  if (s.maximize) g = -g;
  return g;
}

void StoreOut(const StepSpans& spans, size_t i, float p) {
  if (spans.param_out != nullptr) ReferenceStore(p, spans.param_out, *spans.param_out_dtype, i);
}

void AdamElement(const StepScalars& s, const StepSpans& spans, size_t i) {
  float g = LoadGrad(s, spans, i);
  float p = spans.params[i];
  // Adam's L2 term (0 for AdamW). Skipped, not multiplied by 0, when off, so
  // that an inf param does not turn the gradient into NaN (as in torch).
  if (s.weight_decay != 0.0f) g = g + s.weight_decay * p;
  p = p * s.decay_factor;      // AdamW's decoupled decay; 1 for Adam
  const float m = spans.exp_avg[i] * s.beta1 + g * s.one_minus_beta1;
  const float v = spans.exp_avg_sq[i] * s.beta2 + (s.one_minus_beta2 * g) * g;
  float v_hat = v;
  if (s.amsgrad) {
    v_hat = NanMax(spans.max_exp_avg_sq[i], v);
    spans.max_exp_avg_sq[i] = v_hat;
  }
  const float denom = std::sqrt(v_hat) * s.inv_bias_correction2_sqrt + s.eps;
  p = p + s.neg_step_size * (m / denom);
  spans.exp_avg[i] = m;
  spans.exp_avg_sq[i] = v;
  spans.params[i] = p;
  StoreOut(spans, i, p);
}

void AdagradElement(const StepScalars& s, const StepSpans& spans, size_t i) {
  float g = LoadGrad(s, spans, i);
  float p = spans.params[i];
  if (s.weight_decay != 0.0f) g = g + s.weight_decay * p;
  const float sum = spans.exp_avg[i] + g * g;
  const float std_dev = std::sqrt(sum) + s.eps;
  p = p + s.neg_step_size * (g / std_dev);
  spans.exp_avg[i] = sum;
  spans.params[i] = p;
  StoreOut(spans, i, p);
}

void LionElement(const StepScalars& s, const StepSpans& spans, size_t i) {
  const float g = LoadGrad(s, spans, i);
  float p = spans.params[i] * s.decay_factor;
  const float m = spans.exp_avg[i];
  const float update = Sign(m * s.beta1 + g * s.one_minus_beta1);
  p = p + s.neg_step_size * update;
  spans.exp_avg[i] = m * s.beta2 + g * s.one_minus_beta2;
  spans.params[i] = p;
  StoreOut(spans, i, p);
}

// LAMB's update from the new moments and the param before the step.
float LambUpdate(const StepScalars& s, float p, float m, float v) {
  const float denom = s.eps_inside_sqrt ? std::sqrt(v + s.eps) : std::sqrt(v) + s.eps;
  float update = m / denom;
  if (s.weight_decay != 0.0f) update = update + s.weight_decay * p;
  return update;
}

absl::Status CheckLambCall(const OptimizerHyperparams& config, int64_t step) {
  STRATA_RETURN_IF_ERROR(ValidateOptimizerHyperparams(config));
  if (config.kind != OptimizerKind::kLamb) return absl::InvalidArgumentError("not lamb");
  if (step < 1) return absl::InvalidArgumentError("step numbers start at 1");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LambNorms> ReferenceLambMoments(const OptimizerHyperparams& config, int64_t step,
                                               const StepSpans& spans, float grad_scale) {
  STRATA_RETURN_IF_ERROR(CheckLambCall(config, step));
  STRATA_RETURN_IF_ERROR(ValidateStepSpans(config, spans));
  const StepScalars s = ComputeStepScalars(config, step, grad_scale);
  LambNorms total;
  for (size_t block = 0; block < spans.size; block += kLambNormBlock) {
    double p_sums[kLambNormLanes] = {};
    double u_sums[kLambNormLanes] = {};
    const size_t end = std::min(spans.size, block + kLambNormBlock);
    for (size_t i = block; i < end; ++i) {
      const float g = LoadGrad(s, spans, i);
      const float p = spans.params[i];
      const float m = spans.exp_avg[i] * s.beta1 + g * s.one_minus_beta1;
      const float v = spans.exp_avg_sq[i] * s.beta2 + (s.one_minus_beta2 * g) * g;
      spans.exp_avg[i] = m;
      spans.exp_avg_sq[i] = v;
      const double pd = p;
      const double ud = LambUpdate(s, p, m, v);
      p_sums[(i - block) % kLambNormLanes] += pd * pd;
      u_sums[(i - block) % kLambNormLanes] += ud * ud;
    }
    LambNorms norms;
    for (size_t k = 0; k < kLambNormLanes; ++k) {
      norms.param_sq += p_sums[k];
      norms.update_sq += u_sums[k];
    }
    total += norms;
  }
  return total;
}

absl::Status ReferenceLambApply(const OptimizerHyperparams& config, int64_t step,
                                const StepSpans& spans, double trust_ratio) {
  STRATA_RETURN_IF_ERROR(CheckLambCall(config, step));
  STRATA_RETURN_IF_ERROR(ValidateApplySpans(config, spans));
  const StepScalars s = LambApplyScalars(config, step, trust_ratio);
  for (size_t i = 0; i < spans.size; ++i) {
    float p = spans.params[i];
    p = p + s.neg_step_size * LambUpdate(s, p, spans.exp_avg[i], spans.exp_avg_sq[i]);
    spans.params[i] = p;
    StoreOut(spans, i, p);
  }
  return absl::OkStatus();
}

float ReferenceLoad(const void* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kFp32:
      return static_cast<const float*>(data)[i];
    case DType::kFp16:
      return Fp16BitsToFp32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBf16:
      return Bf16BitsToFp32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

void ReferenceStore(float value, void* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kFp32:
      static_cast<float*>(data)[i] = value;
      return;
    case DType::kFp16:
      static_cast<uint16_t*>(data)[i] = Fp32ToFp16Bits(value);
      return;
    case DType::kBf16:
      static_cast<uint16_t*>(data)[i] = Fp32ToBf16Bits(value);
      return;
  }
}

absl::Status ReferenceStep(const OptimizerHyperparams& config, int64_t step,
                           const StepSpans& spans, float grad_scale) {
  STRATA_RETURN_IF_ERROR(ValidateOptimizerHyperparams(config));
  STRATA_RETURN_IF_ERROR(ValidateStepSpans(config, spans));
  if (step < 1) return absl::InvalidArgumentError("step numbers start at 1");
  if (config.kind == OptimizerKind::kLamb) {
    STRATA_ASSIGN_OR_RETURN(const LambNorms norms,
                            ReferenceLambMoments(config, step, spans, grad_scale));
    return ReferenceLambApply(config, step, spans, LambTrustRatio(config, norms));
  }
  const StepScalars s = ComputeStepScalars(config, step, grad_scale);
  for (size_t i = 0; i < spans.size; ++i) {
    switch (config.kind) {
      case OptimizerKind::kAdam:
      case OptimizerKind::kAdamW:
        AdamElement(s, spans, i);
        break;
      case OptimizerKind::kAdagrad:
        AdagradElement(s, spans, i);
        break;
      case OptimizerKind::kLion:
        LionElement(s, spans, i);
        break;
      case OptimizerKind::kLamb:
        break;  // above
      case OptimizerKind::kOther:  // refused by ValidateOptimizerHyperparams
        break;
    }
  }
  return absl::OkStatus();
}

bool ReferenceHasInfOrNan(const GradView& grad) {
  for (size_t i = 0; i < grad.size; ++i) {
    if (!std::isfinite(ReferenceLoad(grad.data, grad.dtype, i))) return true;
  }
  return false;
}

double ReferenceSquaredL2Norm(const GradView& grad) {
  double sum = 0.0;
  for (size_t i = 0; i < grad.size; ++i) {
    const double g = ReferenceLoad(grad.data, grad.dtype, i);
    sum += g * g;
  }
  return sum;
}

}  // namespace strata
