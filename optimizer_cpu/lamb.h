// LAMB (You et al., "Large Batch Optimization for Deep Learning: Training
// BERT in 76 minutes", 2019) as DeepSpeed's FusedLamb runs it
// (deepspeed/ops/lamb/fused_lamb.py, csrc/lamb/fused_lamb_cuda_kernel.cu):
//
//   g *= grad_scale
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//   update = m / (sqrt(v) + eps) + wd*p            (eps_inside_sqrt: sqrt(v + eps))
//   ratio = ||p|| / ||update|| over the tensor, clamped to [min_coeff, max_coeff];
//           1 when either norm is 0
//   p -= step_size * ratio * update,  step_size = lr * sqrt(1-b2^t) / (1-b1^t)
//        (lr without bias_correction)
//
// As in FusedLamb, the bias correction scales the step outside the trust
// ratio, and the update inside it is formed from the uncorrected moments;
// the paper's Algorithm 2 divides the corrected moments instead. Kept as
// DeepSpeed has it, so a job keeps its numbers when its LAMB moves from GPU
// to ZeRO-Offload.
//
// The ratio needs both norms over the whole tensor before any param moves,
// so a step is two passes over memory (fp16 grad and copy: 22 + 18 bytes
// per element against AdamW's 28):
//   1. CpuOptimizer::LambMoments: moments updated in place; returns the sums
//      of squares of p and of the update (LambNorms). A tensor split into
//      ranges (sub-groups, ranks) adds the LambNorms of its ranges.
//   2. LambTrustRatio(config, whole-tensor norms), then
//      CpuOptimizer::LambApply on each range: recomputes the update from
//      p, m and v exactly as pass 1 did, moves p, writes the 16-bit copy.
// CpuOptimizer::Step with kLamb runs both on spans that are one whole tensor.
//
// The sums are in double (squares of floats are exact) and their order is
// fixed: blocks of kLambNormBlock elements from the start of the range, 16
// interleaved accumulators inside a block (kernels on every target and the
// scalar reference add in that same order), blocks added in order. So the
// norms, and the step, are bit-identical across targets, thread counts and
// tile sizes for the same ranges.
#ifndef STRATA_OPTIMIZER_CPU_LAMB_H_
#define STRATA_OPTIMIZER_CPU_LAMB_H_

#include <cstddef>
#include <cstdint>

#include "optimizer_cpu/hyperparams.h"

namespace strata {

// Sums of squares over a range of one tensor.
struct LambNorms {
  double param_sq = 0;   // sum of p^2 (params before the step)
  double update_sq = 0;  // sum of update^2
  LambNorms& operator+=(const LambNorms& o) {
    param_sq += o.param_sq;
    update_sq += o.update_sq;
    return *this;
  }
};

// Elements per partial sum (pass 1 is parallel over these blocks) and
// interleaved accumulators inside one.
inline constexpr size_t kLambNormBlock = 32 * 1024;
inline constexpr size_t kLambNormLanes = 16;

// sqrt(param_sq) / sqrt(update_sq), clamped to [min_coeff, max_coeff]; 1 when
// either is 0. NaN norms (NaN gradients) give NaN, which the step propagates
// into the params, as FusedLamb does. In double; the step rounds
// step_size * ratio to float once.
double LambTrustRatio(const OptimizerHyperparams& config, const LambNorms& norms);

// lr * sqrt(1 - beta2^t) / (1 - beta1^t), or lr without bias correction.
double LambStepSize(const OptimizerHyperparams& config, int64_t step);

// The constants of pass 2: ComputeStepScalars with neg_step_size =
// -(step_size * trust_ratio), rounded once to float.
StepScalars LambApplyScalars(const OptimizerHyperparams& config, int64_t step,
                             double trust_ratio);

}  // namespace strata

#endif  // STRATA_OPTIMIZER_CPU_LAMB_H_
