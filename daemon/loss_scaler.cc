#include "daemon/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace strata {

LossScaler::LossScaler(const LossScaleConfig& config) : config_(config) {
  if (!config_.enabled) {
    state_.scale = 1.0;
  } else if (config_.loss_scale > 0) {
    state_.scale = config_.loss_scale;
  } else {
    state_.scale = std::ldexp(1.0, config_.initial_scale_power);
  }
  state_.hysteresis_left = config_.hysteresis;
}

LossScaler::LossScaler(const LossScaleConfig& config, const LossScalerState& state)
    : config_(config), state_(state) {}

void LossScaler::Update(bool overflow) {
  const bool dynamic = config_.enabled && config_.loss_scale <= 0;
  if (dynamic) {
    if (overflow) {
      if (config_.hysteresis <= 1 || state_.hysteresis_left <= 1) {
        state_.scale = std::max(state_.scale / 2.0, config_.min_loss_scale);
      } else {
        --state_.hysteresis_left;
      }
      state_.last_overflow_iteration = state_.iteration;
      state_.any_overflow = true;
    } else {
      // As DeepSpeed 0.19's DynamicLossScaler: the scale doubles when the
      // clean steps before this one since the last overflow (or the start)
      // fill a window, i.e. on the (window+1)-th clean step.
      const uint64_t since = state_.any_overflow ? state_.iteration - state_.last_overflow_iteration
                                                 : state_.iteration + 1;
      const uint64_t stable = since - 1;
      if (stable > 0 && stable % config_.loss_scale_window == 0) {
        state_.hysteresis_left = config_.hysteresis;
        state_.scale *= 2.0;
      }
    }
  }
  ++state_.iteration;
}

}  // namespace strata
