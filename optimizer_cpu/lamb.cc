#include "optimizer_cpu/lamb.h"

#include <cmath>

namespace strata {

double LambTrustRatio(const OptimizerHyperparams& config, const LambNorms& norms) {
  const double w = std::sqrt(norms.param_sq);
  const double u = std::sqrt(norms.update_sq);
  if (w == 0.0 || u == 0.0) return 1.0;
  double ratio = w / u;
  // As FusedLamb: two comparisons, so a NaN ratio stays NaN.
  if (ratio > config.max_coeff) ratio = config.max_coeff;
  if (ratio < config.min_coeff) ratio = config.min_coeff;
  return ratio;
}

double LambStepSize(const OptimizerHyperparams& config, int64_t step) {
  if (!config.bias_correction) return config.lr;
  const double t = static_cast<double>(step);
  return config.lr * std::sqrt(1.0 - std::pow(config.beta2, t)) /
         (1.0 - std::pow(config.beta1, t));
}

StepScalars LambApplyScalars(const OptimizerHyperparams& config, int64_t step,
                             double trust_ratio) {
  StepScalars s = ComputeStepScalars(config, step, 1.0f);
  s.neg_step_size = static_cast<float>(-(LambStepSize(config, step) * trust_ratio));
  return s;
}

}  // namespace strata
