// The memory one optimizer step reads and writes: fp32 master params and
// states updated in place, a gradient in fp32/fp16/bf16, and an optional
// 16-bit copy of the updated params written in the same pass.
//
// The spans are borrowed: the caller owns the memory and keeps it valid for
// the duration of the call. Any alignment is accepted; the spans of one step
// must not overlap, with one exception: param_out may be the gradient itself
// (the same address, elements of the same size) -- each element's gradient
// is read before its param is written, so the new params replace the
// gradient in place (the daemon's early ZeRO-Infinity steps rely on it;
// kernels_test checks every target).
#ifndef STRATA_OPTIMIZER_CPU_STEP_SPANS_H_
#define STRATA_OPTIMIZER_CPU_STEP_SPANS_H_

#include <cstddef>
#include <optional>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "optimizer_cpu/hyperparams.h"

namespace strata {

struct StepSpans {
  size_t size = 0;  // elements in every span
  float* params = nullptr;
  // Adam/AdamW: first moment. Adagrad: sum of squared gradients. Lion: momentum.
  float* exp_avg = nullptr;
  // Adam/AdamW: second moment; null for Adagrad and Lion.
  float* exp_avg_sq = nullptr;
  // Adam/AdamW with amsgrad: running max of exp_avg_sq; null otherwise.
  float* max_exp_avg_sq = nullptr;
  const void* grad = nullptr;
  DType grad_dtype = DType::kFp32;
  // Optional copy of the updated params, fp16 or bf16 (round to nearest even).
  void* param_out = nullptr;
  std::optional<DType> param_out_dtype;
};

// A read-only gradient buffer, for the helpers (inf/nan check, norm).
struct GradView {
  const void* data = nullptr;
  DType dtype = DType::kFp32;
  size_t size = 0;
};

// InvalidArgument when a span the algorithm needs is null (with size > 0), a
// span it does not use is set (exp_avg_sq for Lion: a caller bug that would
// otherwise go unnoticed), param_out and its dtype disagree, or param_out's
// dtype is fp32 (the fp32 params are already the output).
absl::Status ValidateStepSpans(const OptimizerHyperparams& config, const StepSpans& spans);
// The params and state checks of ValidateStepSpans only (grad and param_out
// are not looked at), for state initialization.
absl::Status ValidateStateSpans(const OptimizerHyperparams& config, const StepSpans& spans);
// ValidateStepSpans without the gradient (LAMB's second pass reads none).
absl::Status ValidateApplySpans(const OptimizerHyperparams& config, const StepSpans& spans);

}  // namespace strata

#endif  // STRATA_OPTIMIZER_CPU_STEP_SPANS_H_
