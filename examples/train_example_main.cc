// strata-train-example: trains a small MLP on the CPU as N data-parallel
// ranks (separate processes), with no offload, through stratad with
// ZeRO-Offload, or through stratad with ZeRO-Infinity. Rank 0 prints
// "step <n> loss <x>" per step; the three modes print the same lines.
//
//   strata-train-example --mode local --ranks 2 --steps 5
//   strata-train-example --mode offload --ranks 2 --steps 5 --socket /tmp/s/stratad.sock
//   strata-train-example --mode infinity --ranks 2 --steps 5 --socket /tmp/s/stratad.sock
//
// Exit status: 0 when every rank finished, 1 when one failed (the reasons
// are printed), 2 for a usage error.
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/byte_size.h"
#include "core/command_line.h"
#include "core/status_macros.h"
#include "examples/daemon_backend.h"
#include "examples/deepspeed_configs.h"
#include "examples/local_backend.h"
#include "examples/mlp.h"
#include "examples/rank_launcher.h"
#include "examples/shm_world.h"
#include "examples/train_options.h"
#include "examples/train_rank.h"

namespace strata {
namespace {

template <typename T>
std::function<absl::Status(absl::string_view)> ParseNumber(std::string flag, T* target) {
  return [flag, target](absl::string_view text) {
    if (!absl::SimpleAtoi(text, target)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", text, ": expected a whole number"));
    }
    return absl::OkStatus();
  };
}

std::function<absl::Status(absl::string_view)> ParseBytes(std::string flag, uint64_t* target) {
  return [flag, target](absl::string_view text) -> absl::Status {
    absl::StatusOr<uint64_t> bytes = ParseByteSize(text);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", bytes.status().message()));
    }
    *target = *bytes;
    return absl::OkStatus();
  };
}

absl::Status RunRank(const TrainOptions& options, ShmWorld* world, uint32_t rank) {
  Mlp model(options.widths);
  std::unique_ptr<ZeroBackend> backend;
  if (options.mode == TrainMode::kLocal) {
    STRATA_ASSIGN_OR_RETURN(backend, LocalBackend::Create(model.tensors(), world, rank,
                                                          OffloadDeepSpeedConfig(options.batch_rows)));
  } else {
    STRATA_ASSIGN_OR_RETURN(backend, DaemonBackend::Create(options, model, world, rank));
  }
  return TrainRank(options, world, rank, &model, backend.get(), stdout);
}

int Main(int argc, char** argv) {
  TrainOptions options;
  std::string mode = "local";
  bool job_given = false;
  CommandLine flags("strata-train-example");
  flags.AddString("mode", &mode, "local | offload | infinity (default local)");
  flags.AddParsed("ranks", ParseNumber("ranks", &options.world_size),
                  "data-parallel ranks, one process each (default 2)");
  flags.AddParsed("steps", ParseNumber("steps", &options.steps), "training steps (default 10)");
  flags.AddParsed("batch", ParseNumber("batch", &options.batch_rows),
                  "samples per rank and step (default 64)");
  flags.AddParsed("seed", ParseNumber("seed", &options.seed), "model init and data seed");
  flags.AddString("socket", &options.socket_path, "stratad's --socket (offload, infinity)");
  flags.AddString("job", &options.job_name, "job name in the daemon (default: unique per run)",
                  &job_given);
  flags.AddString("nvme_path", &options.nvme_path,
                  "nvme_path written into the infinity DeepSpeed config (default /local_nvme)");
  flags.AddParsed("device_budget", ParseBytes("device_budget", &options.device_budget_bytes),
                  "the job's device-tier budget, e.g. 96KiB (default: none)");
  flags.AddBool("device_tier", &options.device_tier,
                "infinity: acquire params into the daemon's device tier and read them from its arena");
  flags.AddParsed("park_after_step", ParseNumber("park_after_step", &options.park_after_step),
                  "infinity: park the job after this many steps and resume it (default 0: never)");
  flags.AddString("park_tier", &options.park_tier, "where --park_after_step parks: nvme (default) or pinned_host");
  flags.AddParsed("pinned_budget", ParseBytes("pinned_budget", &options.pinned_budget_bytes),
                  "the job's pinned-host budget (default: the daemon's)");
  flags.AddBool("stats", &options.print_stats,
                "daemon modes: print the daemon's stats to stderr after the last step");
  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n%s", std::string(s.message()).c_str(), flags.Usage().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "strata-train-example: unexpected argument '%s'\n",
                 flags.positional().front().c_str());
    return 2;
  }
  absl::StatusOr<TrainMode> parsed_mode = ParseTrainMode(mode);
  if (!parsed_mode.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed_mode.status().message()).c_str());
    return 2;
  }
  options.mode = *parsed_mode;
  if (!job_given) {
    options.job_name = absl::StrCat("train-example-", TrainModeName(options.mode), "-", getpid());
  }
  if (absl::Status s = ValidateTrainOptions(options); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }

  // Sized for the largest collective: the gradient all-reduce of the whole model.
  const uint64_t capacity = Mlp(options.widths).numel();
  absl::StatusOr<std::unique_ptr<ShmWorld>> world = ShmWorld::Create(options.world_size, capacity);
  if (!world.ok()) {
    std::fprintf(stderr, "strata-train-example: %s\n", world.status().ToString().c_str());
    return 1;
  }
  absl::Status status = RunRanks(options.world_size, [&](uint32_t rank) {
    return RunRank(options, world->get(), rank);
  });
  if (!status.ok()) {
    std::fprintf(stderr, "strata-train-example (%s, %u ranks): %s\n",
                 std::string(TrainModeName(options.mode)).c_str(), options.world_size,
                 std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::Main(argc, argv); }
