// The optimizer algorithms strata runs on the CPU and their hyperparameters.
//
// Each algorithm follows the semantics of the PyTorch optimizer of the same
// name (torch.optim, 1.13), so a job moved from GPU Adam to ZeRO-Offload keeps
// its numbers: Adam adds L2 weight decay to the gradient, AdamW decays the
// weights (decoupled), both with optional AMSGrad and bias correction; Adagrad
// has lr_decay, initial_accumulator_value and eps. Lion (not in torch 1.13)
// follows Chen et al., "Symbolic Discovery of Optimization Algorithms" (2023),
// Algorithm 2, as written in lucidrains/lion-pytorch:
//   p <- p * (1 - lr * wd)
//   p <- p - lr * sign(beta1 * m + (1 - beta1) * g)
//   m <- beta2 * m + (1 - beta2) * g
// LAMB (not in torch; DeepSpeed has it on GPU only, FusedLamb) follows You et
// al., "Large Batch Optimization for Deep Learning" (2019), as DeepSpeed runs
// it: see lamb.h.
#ifndef STRATA_OPTIMIZER_CPU_HYPERPARAMS_H_
#define STRATA_OPTIMIZER_CPU_HYPERPARAMS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/deepspeed_config.h"

namespace strata {

// OptimizerKind (kAdam, kAdamW, kAdagrad, kLion, kLamb) and OptimizerKindName come
// from core/deepspeed_config.h, which reads them from DeepSpeed configs.

// "adam", "adamw", "adagrad", "lion", "lamb", case-insensitive. InvalidArgument names the accepted ones.
absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view text);

// Hyperparameters. Defaults are torch.optim's (Lion's are the paper's).
// Doubles, as in Python: the per-step constants are computed in double and
// rounded once to float, the way torch passes Python scalars to its kernels.
struct OptimizerHyperparams {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;
  // Adam/AdamW/LAMB: the moment decays. Lion: beta1 interpolates the update,
  // beta2 decays the momentum. Unused by Adagrad.
  double beta1 = 0.9;
  double beta2 = 0.999;
  // Adam/AdamW/Adagrad/LAMB; added outside the square root, as torch does
  // (LAMB with eps_inside_sqrt: inside).
  double eps = 1e-8;
  // Adam and Adagrad: L2 (added to the gradient). AdamW and Lion: decoupled.
  // LAMB: added to the update (wd * p), inside the trust ratio.
  double weight_decay = 0.0;
  bool amsgrad = false;          // Adam/AdamW only.
  bool maximize = false;         // all: ascend instead of descend.
  bool bias_correction = true;   // Adam/AdamW/LAMB.
  double lr_decay = 0.0;                   // Adagrad only.
  double initial_accumulator_value = 0.0;  // Adagrad only.
  // LAMB only (DeepSpeed FusedLamb's names and defaults): the trust ratio
  // ||p|| / ||update|| is clamped to [min_coeff, max_coeff]; eps_inside_sqrt
  // puts eps under the square root (FusedLamb's eps_mode 0).
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  bool eps_inside_sqrt = false;
};

// The hyperparameters of a DeepSpeed "optimizer" section (core's reader has
// already applied DeepSpeed's per-kind defaults).
OptimizerHyperparams HyperparamsFromDeepSpeed(const OptimizerConfig& deepspeed);

// Lion's usual defaults (lr 1e-4, betas 0.9/0.99), for callers that want them.
OptimizerHyperparams DefaultLionHyperparams();

// InvalidArgument, naming the field, for: lr, eps, weight_decay, lr_decay or
// initial_accumulator_value negative or not finite; beta1 or beta2 outside
// [0, 1); amsgrad with a kind other than Adam/AdamW; for LAMB, max_coeff or
// min_coeff negative or not finite, or min_coeff > max_coeff.
absl::Status ValidateOptimizerHyperparams(const OptimizerHyperparams& config);

// Which state buffers an algorithm keeps besides the fp32 params:
// Adam/AdamW/LAMB: exp_avg, exp_avg_sq (+ max_exp_avg_sq with amsgrad);
// Adagrad: the sum of squares (held in exp_avg); Lion: exp_avg.
struct StateLayout {
  bool exp_avg = false;
  bool exp_avg_sq = false;
  bool max_exp_avg_sq = false;
};
StateLayout StateLayoutFor(const OptimizerHyperparams& config);

// The float constants of one step, computed once per call and shared by the
// vector kernels and the scalar reference so that both round identically.
struct StepScalars {
  float beta1 = 0;            // Adam/Lion: beta1
  float one_minus_beta1 = 0;  // (float)(1 - beta1)
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float eps = 0;
  float weight_decay = 0;     // L2 coefficient (Adam, Adagrad), LAMB's update decay; 0 otherwise
  float decay_factor = 1;     // (float)(1 - lr * wd) for AdamW/Lion; 1 otherwise
  // -lr / (1 - beta1^t) (Adam), -clr (Adagrad), -lr (Lion), LAMB: see lamb.h
  float neg_step_size = 0;
  // 1 / sqrt(1 - beta2^t), Adam only. torch divides sqrt(v) by
  // sqrt(1 - beta2^t); we multiply by the reciprocal (rounded once, in double)
  // because a vector divide costs as much as the memory traffic of an element
  // on one core: the step keeps one sqrt and one divide per element. The
  // difference is at most an ulp of the denominator.
  float inv_bias_correction2_sqrt = 1;
  float grad_scale = 1;       // multiplies every gradient first
  bool maximize = false;
  bool amsgrad = false;
  bool eps_inside_sqrt = false;  // LAMB
};

// REQUIRES: ValidateOptimizerHyperparams(config).ok(), step >= 1.
StepScalars ComputeStepScalars(const OptimizerHyperparams& config, int64_t step,
                               float grad_scale);

}  // namespace strata

#endif  // STRATA_OPTIMIZER_CPU_HYPERPARAMS_H_
