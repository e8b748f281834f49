// A plain scalar implementation of every optimizer step and helper: the
// oracle the vector kernels are tested against, element by element and bit
// for bit. It performs the same float operations in the same order as the
// kernels (no FMA contraction: the library builds with -ffp-contract=off), so
// any difference is a kernel bug. Slow by design; never used on a hot path.
#ifndef STRATA_OPTIMIZER_CPU_REFERENCE_OPTIMIZER_H_
#define STRATA_OPTIMIZER_CPU_REFERENCE_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "optimizer_cpu/hyperparams.h"
#include "optimizer_cpu/lamb.h"
#include "optimizer_cpu/step_spans.h"

namespace strata {

// One step (step >= 1, counted from 1 as torch does) over all of `spans`
// (LAMB: one whole tensor). Returns the errors of
// ValidateOptimizerHyperparams / ValidateStepSpans.
absl::Status ReferenceStep(const OptimizerHyperparams& config, int64_t step,
                           const StepSpans& spans, float grad_scale = 1.0f);

// LAMB's two passes (lamb.h), the sums in the order lamb.h fixes.
absl::StatusOr<LambNorms> ReferenceLambMoments(const OptimizerHyperparams& config, int64_t step,
                                               const StepSpans& spans, float grad_scale = 1.0f);
absl::Status ReferenceLambApply(const OptimizerHyperparams& config, int64_t step,
                                const StepSpans& spans, double trust_ratio);

// Reads element i of a gradient buffer of the given dtype as fp32.
float ReferenceLoad(const void* data, DType dtype, size_t i);
// Writes `value` as element i of a 16-bit or fp32 buffer (see half.h).
void ReferenceStore(float value, void* data, DType dtype, size_t i);

bool ReferenceHasInfOrNan(const GradView& grad);
double ReferenceSquaredL2Norm(const GradView& grad);

}  // namespace strata

#endif  // STRATA_OPTIMIZER_CPU_REFERENCE_OPTIMIZER_H_
