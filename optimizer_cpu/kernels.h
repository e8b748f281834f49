// Entry points of the vector kernels, one per algorithm and helper. Each
// processes the element range [begin, end) of its buffers with the best
// Highway target the CPU supports (chosen at runtime: AVX-512, AVX2+F16C,
// SSE4, SSSE3, or Highway's portable scalar target) and is called by CpuOptimizer on tiles.
// Internal: callers use CpuOptimizer, which validates the arguments first.
#ifndef STRATA_OPTIMIZER_CPU_KERNELS_H_
#define STRATA_OPTIMIZER_CPU_KERNELS_H_

#include <cstddef>

#include "core/dtype.h"
#include "optimizer_cpu/hyperparams.h"
#include "optimizer_cpu/lamb.h"
#include "optimizer_cpu/step_spans.h"

namespace strata::internal {

void AdamRange(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end);
void AdagradRange(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end);
void LionRange(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end);
// LAMB pass 1 (moments; the norms of [begin, end) in the order of lamb.h)
// and pass 2 (params and 16-bit copy; s from LambApplyScalars).
LambNorms LambMomentsRange(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end);
void LambApplyRange(const StepScalars& s, const StepSpans& spans, size_t begin, size_t end);

bool HasInfOrNanRange(const GradView& grad, size_t begin, size_t end);
// Sum of squares in double (exact products, double accumulation).
double SquaredL2NormRange(const GradView& grad, size_t begin, size_t end);
void ToFp32Range(const void* src, DType src_dtype, float* dst, size_t begin, size_t end);
void FromFp32Range(const float* src, void* dst, DType dst_dtype, size_t begin, size_t end);

// Name of the Highway target the kernels dispatch to now ("AVX3", "AVX2", ...).
const char* ActiveTargetName();

}  // namespace strata::internal

#endif  // STRATA_OPTIMIZER_CPU_KERNELS_H_
