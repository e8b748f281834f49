#include "optimizer_cpu/hyperparams.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "optimizer_cpu/lamb.h"

namespace strata {
namespace {

absl::Status CheckNonNegative(absl::string_view name, double value) {
  if (!std::isfinite(value) || value < 0.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer ", name, " is ", value, "; it must be finite and >= 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckBeta(absl::string_view name, double value) {
  if (!(value >= 0.0 && value < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer ", name, " is ", value, "; it must be in [0, 1)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW,
                             OptimizerKind::kAdagrad, OptimizerKind::kLion,
                             OptimizerKind::kLamb}) {
    if (lower == OptimizerKindName(kind)) return kind;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown optimizer '", text, "'; expected adam, adamw, adagrad, lion or lamb"));
}

OptimizerHyperparams HyperparamsFromDeepSpeed(const OptimizerConfig& deepspeed) {
  OptimizerHyperparams h;
  h.kind = deepspeed.kind;
  h.lr = deepspeed.lr;
  h.beta1 = deepspeed.betas[0];
  h.beta2 = deepspeed.betas[1];
  h.eps = deepspeed.eps;
  h.weight_decay = deepspeed.weight_decay;
  h.amsgrad = deepspeed.amsgrad;
  h.lr_decay = deepspeed.lr_decay;
  h.initial_accumulator_value = deepspeed.initial_accumulator_value;
  return h;
}

OptimizerHyperparams DefaultLionHyperparams() {
  OptimizerHyperparams config;
  config.kind = OptimizerKind::kLion;
  config.lr = 1e-4;
  config.beta1 = 0.9;
  config.beta2 = 0.99;
  return config;
}

absl::Status ValidateOptimizerHyperparams(const OptimizerHyperparams& config) {
  if (config.kind != OptimizerKind::kAdam && config.kind != OptimizerKind::kAdamW &&
      config.kind != OptimizerKind::kAdagrad && config.kind != OptimizerKind::kLion &&
      config.kind != OptimizerKind::kLamb) {
    return absl::InvalidArgumentError(
        "optimizer kind is not one of adam, adamw, adagrad, lion, lamb");
  }
  if (auto s = CheckNonNegative("lr", config.lr); !s.ok()) return s;
  if (auto s = CheckNonNegative("eps", config.eps); !s.ok()) return s;
  if (auto s = CheckNonNegative("weight_decay", config.weight_decay); !s.ok()) return s;
  if (auto s = CheckNonNegative("lr_decay", config.lr_decay); !s.ok()) return s;
  if (auto s = CheckNonNegative("initial_accumulator_value",
                                config.initial_accumulator_value);
      !s.ok()) {
    return s;
  }
  if (config.kind != OptimizerKind::kAdagrad) {
    if (auto s = CheckBeta("beta1", config.beta1); !s.ok()) return s;
    if (auto s = CheckBeta("beta2", config.beta2); !s.ok()) return s;
  }
  if (config.kind == OptimizerKind::kLamb) {
    if (auto s = CheckNonNegative("max_coeff", config.max_coeff); !s.ok()) return s;
    if (auto s = CheckNonNegative("min_coeff", config.min_coeff); !s.ok()) return s;
    if (config.min_coeff > config.max_coeff) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lamb min_coeff ", config.min_coeff, " is above max_coeff ", config.max_coeff));
    }
  }
  if (config.amsgrad && config.kind != OptimizerKind::kAdam &&
      config.kind != OptimizerKind::kAdamW) {
    return absl::InvalidArgumentError(absl::StrCat(
        "amsgrad applies to adam and adamw only, not ", OptimizerKindName(config.kind)));
  }
  return absl::OkStatus();
}

StateLayout StateLayoutFor(const OptimizerHyperparams& config) {
  StateLayout layout;
  layout.exp_avg = true;
  switch (config.kind) {
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
    case OptimizerKind::kLamb:
      layout.exp_avg_sq = true;
      layout.max_exp_avg_sq = config.amsgrad;
      break;
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kLion:
    case OptimizerKind::kOther:  // refused by ValidateOptimizerHyperparams
      break;
  }
  return layout;
}

StepScalars ComputeStepScalars(const OptimizerHyperparams& config, int64_t step,
                               float grad_scale) {
  StepScalars s;
  s.grad_scale = grad_scale;
  s.maximize = config.maximize;
  s.eps = static_cast<float>(config.eps);
  const double t = static_cast<double>(step);
  switch (config.kind) {
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      s.amsgrad = config.amsgrad;
      s.beta1 = static_cast<float>(config.beta1);
      s.one_minus_beta1 = static_cast<float>(1.0 - config.beta1);
      s.beta2 = static_cast<float>(config.beta2);
      s.one_minus_beta2 = static_cast<float>(1.0 - config.beta2);
      // As torch: step_size = lr / (1 - beta1**t), bias_correction2_sqrt =
      // math.sqrt(1 - beta2**t), both in double, rounded when the kernel
      // receives them.
      double step_size = config.lr;
      double bc2_sqrt = 1.0;
      if (config.bias_correction) {
        step_size = config.lr / (1.0 - std::pow(config.beta1, t));
        bc2_sqrt = std::sqrt(1.0 - std::pow(config.beta2, t));
      }
      s.neg_step_size = static_cast<float>(-step_size);
      s.inv_bias_correction2_sqrt = static_cast<float>(1.0 / bc2_sqrt);
      if (config.kind == OptimizerKind::kAdam) {
        s.weight_decay = static_cast<float>(config.weight_decay);
      } else {
        s.decay_factor = static_cast<float>(1.0 - config.lr * config.weight_decay);
      }
      break;
    }
    case OptimizerKind::kAdagrad: {
      s.weight_decay = static_cast<float>(config.weight_decay);
      const double clr = config.lr / (1.0 + (t - 1.0) * config.lr_decay);
      s.neg_step_size = static_cast<float>(-clr);
      break;
    }
    case OptimizerKind::kLamb:
      // neg_step_size here is -step_size alone; LambApplyScalars (lamb.h)
      // folds in the trust ratio.
      s.beta1 = static_cast<float>(config.beta1);
      s.one_minus_beta1 = static_cast<float>(1.0 - config.beta1);
      s.beta2 = static_cast<float>(config.beta2);
      s.one_minus_beta2 = static_cast<float>(1.0 - config.beta2);
      s.weight_decay = static_cast<float>(config.weight_decay);
      s.eps_inside_sqrt = config.eps_inside_sqrt;
      s.neg_step_size = static_cast<float>(-LambStepSize(config, step));
      break;
    case OptimizerKind::kLion:
      s.beta1 = static_cast<float>(config.beta1);
      s.one_minus_beta1 = static_cast<float>(1.0 - config.beta1);
      s.beta2 = static_cast<float>(config.beta2);
      s.one_minus_beta2 = static_cast<float>(1.0 - config.beta2);
      s.decay_factor = static_cast<float>(1.0 - config.lr * config.weight_decay);
      s.neg_step_size = static_cast<float>(-config.lr);
      break;
    case OptimizerKind::kOther:  // refused by ValidateOptimizerHyperparams
      break;
  }
  return s;
}

}  // namespace strata
