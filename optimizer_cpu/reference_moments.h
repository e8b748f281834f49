// The scalar reference for compressed moments (moment_format.h), beside
// reference_optimizer.h: a step over bf16 or 8-bit moments is defined as
//   dequantize the block's moments to fp32 -> the fp32 reference step of
//   the block -> requantize (bf16: round to nearest even; 8-bit: a new
//   absmax per block, codes per QuantizeMomentBlock8).
// The vector kernels do this in one pass over memory and must match it bit
// for bit on every target. Slow by design.
#ifndef STRATA_OPTIMIZER_CPU_REFERENCE_MOMENTS_H_
#define STRATA_OPTIMIZER_CPU_REFERENCE_MOMENTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "optimizer_cpu/hyperparams.h"
#include "optimizer_cpu/step_spans.h"

namespace strata {

// REQUIRES: spans.moment_format != kFp32, config and spans validated,
// step >= 1. Called by ReferenceStep.
absl::Status ReferenceCompressedStep(const OptimizerHyperparams& config, int64_t step,
                                     const StepSpans& spans, float grad_scale);

}  // namespace strata

#endif  // STRATA_OPTIMIZER_CPU_REFERENCE_MOMENTS_H_
