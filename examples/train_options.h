// What one run of the example trainer does: the mode, the world, the model
// and data, and for the daemon modes which daemon and job to use.
#ifndef STRATA_EXAMPLES_TRAIN_OPTIONS_H_
#define STRATA_EXAMPLES_TRAIN_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

enum class TrainMode : uint8_t { kLocal = 0, kOffload = 1, kInfinity = 2 };

// "local", "offload", "infinity".
absl::string_view TrainModeName(TrainMode mode);
// InvalidArgument naming the accepted modes.
absl::StatusOr<TrainMode> ParseTrainMode(absl::string_view text);

struct TrainOptions {
  TrainMode mode = TrainMode::kLocal;
  uint32_t world_size = 2;
  uint64_t steps = 10;
  // Model: an MLP of these widths (inputs, hidden..., classes).
  std::vector<int> widths = {64, 128, 128, 10};
  int batch_rows = 64;  // per rank and step
  uint64_t seed = 1234;

  // Daemon modes only.
  std::string socket_path;  // stratad's --socket
  std::string job_name;     // unique among the daemon's live jobs
  std::string nvme_path = "/local_nvme";  // written into the infinity config
  uint64_t device_budget_bytes = 0;       // 0 = none (no device tier for the job)
  uint64_t pinned_budget_bytes = 0;
  // Infinity: acquire params into the daemon's device tier and read them
  // from its arena (needs device_budget_bytes > 0).
  bool device_tier = false;
  // Infinity: after this step (1-based count of steps done; 0 = never) rank 0
  // parks the job to park_tier and resumes it, all ranks waiting, and prints
  // what moved and how long it took to stderr.
  uint64_t park_after_step = 0;
  std::string park_tier = "nvme";
  // Rank 0 prints the daemon's stats (tiers, the job's NVMe traffic) to
  // stderr after the last step.
  bool print_stats = false;
};

// InvalidArgument naming the option: no ranks or steps, fewer than two
// widths or a width < 1, batch_rows < 1, a daemon mode without a socket or
// job name, --device_tier or a park outside infinity mode or without a
// device budget.
absl::Status ValidateTrainOptions(const TrainOptions& options);

}  // namespace strata

#endif  // STRATA_EXAMPLES_TRAIN_OPTIONS_H_
