// LossScaler: DeepSpeed's dynamic loss scaling for fp16 training, kept by the
// daemon per job so every rank sees the same scale and the same skip decision.
//
// Dynamic (fp16.loss_scale == 0): start at 2^initial_scale_power; on an
// overflow, use up one unit of hysteresis, and when none is left halve the
// scale (not below min_loss_scale); after loss_scale_window steps without an
// overflow double it and restore the hysteresis. Static (loss_scale > 0): the
// scale never changes, and overflowed steps are still skipped. Disabled (no
// fp16): scale 1, nothing is ever skipped for overflow.
#ifndef STRATA_DAEMON_LOSS_SCALER_H_
#define STRATA_DAEMON_LOSS_SCALER_H_

#include <cstdint>

#include "core/deepspeed_config.h"

namespace strata {

struct LossScalerState {
  double scale = 1.0;
  uint32_t hysteresis_left = 0;
  uint64_t iteration = 0;            // steps seen, skipped ones included
  uint64_t last_overflow_iteration = 0;
  bool any_overflow = false;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& config);
  LossScaler(const LossScaleConfig& config, const LossScalerState& state);

  // Whether overflowed steps are skipped (fp16 enabled).
  bool enabled() const { return config_.enabled; }
  double scale() const { return state_.scale; }
  // Records one step's outcome and moves the scale as DeepSpeed does.
  void Update(bool overflow);
  const LossScalerState& state() const { return state_; }

 private:
  LossScaleConfig config_;
  LossScalerState state_;
};

}  // namespace strata

#endif  // STRATA_DAEMON_LOSS_SCALER_H_
