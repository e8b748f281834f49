#include "optimizer_cpu/step_spans.h"

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

absl::Status CheckSpan(const OptimizerHyperparams& config, const char* name,
                       const void* ptr, bool needed, size_t size) {
  if (needed && ptr == nullptr && size > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        OptimizerKindName(config.kind), " step: span '", name, "' is null but ",
        size, " elements were given"));
  }
  if (!needed && ptr != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        OptimizerKindName(config.kind), " step: span '", name,
        "' is set but this optimizer", config.amsgrad ? "" : " (without amsgrad)",
        " does not use it; pass null"));
  }
  return absl::OkStatus();
}

absl::Status CheckParamOut(const StepSpans& spans) {
  if ((spans.param_out != nullptr) != spans.param_out_dtype.has_value()) {
    return absl::InvalidArgumentError(
        "step: param_out and param_out_dtype must be given together");
  }
  if (spans.param_out_dtype.has_value() && *spans.param_out_dtype == DType::kFp32) {
    return absl::InvalidArgumentError(
        "step: param_out_dtype must be fp16 or bf16; the fp32 params are updated in place");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateStepSpans(const OptimizerHyperparams& config, const StepSpans& spans) {
  if (auto s = ValidateStateSpans(config, spans); !s.ok()) return s;
  if (auto s = CheckSpan(config, "grad", spans.grad, true, spans.size); !s.ok()) return s;
  return CheckParamOut(spans);
}

absl::Status ValidateApplySpans(const OptimizerHyperparams& config, const StepSpans& spans) {
  if (auto s = ValidateStateSpans(config, spans); !s.ok()) return s;
  return CheckParamOut(spans);
}

absl::Status ValidateStateSpans(const OptimizerHyperparams& config, const StepSpans& spans) {
  const StateLayout layout = StateLayoutFor(config);
  if (auto s = CheckSpan(config, "params", spans.params, true, spans.size); !s.ok()) return s;
  if (auto s = CheckSpan(config, "exp_avg", spans.exp_avg, layout.exp_avg, spans.size);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckSpan(config, "exp_avg_sq", spans.exp_avg_sq, layout.exp_avg_sq,
                         spans.size);
      !s.ok()) {
    return s;
  }
  if (auto s = CheckSpan(config, "max_exp_avg_sq", spans.max_exp_avg_sq,
                         layout.max_exp_avg_sq, spans.size);
      !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

}  // namespace strata
