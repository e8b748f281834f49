#include "examples/train_options.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace strata {

absl::string_view TrainModeName(TrainMode mode) {
  switch (mode) {
    case TrainMode::kLocal: return "local";
    case TrainMode::kOffload: return "offload";
    case TrainMode::kInfinity: return "infinity";
  }
  return "unknown";
}

absl::StatusOr<TrainMode> ParseTrainMode(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  for (TrainMode mode : {TrainMode::kLocal, TrainMode::kOffload, TrainMode::kInfinity}) {
    if (lower == TrainModeName(mode)) return mode;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--mode=", text, ": expected local, offload or infinity"));
}

absl::Status ValidateTrainOptions(const TrainOptions& options) {
  if (options.world_size == 0) return absl::InvalidArgumentError("--ranks must be at least 1");
  if (options.steps == 0) return absl::InvalidArgumentError("--steps must be at least 1");
  if (options.widths.size() < 2) {
    return absl::InvalidArgumentError("the model needs at least an input and an output width");
  }
  for (int w : options.widths) {
    if (w < 1) return absl::InvalidArgumentError(absl::StrCat("model width ", w, " is not positive"));
  }
  if (options.batch_rows < 1) return absl::InvalidArgumentError("--batch must be at least 1");
  if (options.mode != TrainMode::kLocal) {
    if (options.socket_path.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mode=", TrainModeName(options.mode), " needs --socket: the path stratad listens on"));
    }
    if (options.job_name.empty()) return absl::InvalidArgumentError("the job name is empty");
  }
  if ((options.device_tier || options.park_after_step > 0) && options.mode != TrainMode::kInfinity) {
    return absl::InvalidArgumentError("--device_tier and --park_after_step need --mode infinity");
  }
  if (options.device_tier && options.device_budget_bytes == 0) {
    return absl::InvalidArgumentError(
        "--device_tier needs --device_budget (the job's share of stratad's --device_capacity), e.g. 96KiB");
  }
  if (options.park_after_step > 0 && options.park_tier != "nvme" && options.park_tier != "pinned_host") {
    return absl::InvalidArgumentError(
        absl::StrCat("--park_tier=", options.park_tier, ": expected nvme or pinned_host"));
  }
  return absl::OkStatus();
}

}  // namespace strata
