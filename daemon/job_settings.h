// JobSettings: what a job is, resolved once from CreateJob (its DeepSpeed
// config plus explicit overrides) and validated.
#ifndef STRATA_DAEMON_JOB_SETTINGS_H_
#define STRATA_DAEMON_JOB_SETTINGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/deepspeed_config.h"
#include "core/dtype.h"
#include "optimizer_cpu/hyperparams.h"
#include "strata/v1/strata.pb.h"

namespace strata {

struct JobSettings {
  std::string name;
  uint32_t world_size = 1;
  strata::v1::Mode mode = strata::v1::MODE_OFFLOAD;
  int stage = 2;
  OptimizerHyperparams optimizer;
  DType param_dtype = DType::kFp16;
  DType grad_dtype = DType::kFp16;
  LossScaleConfig loss_scale;  // fp16 section; disabled for bf16/fp32
  double gradient_clipping = 0;
  uint64_t sub_group_size = 1'000'000'000;
  uint64_t pinned_budget_bytes = 0;
  uint64_t device_budget_bytes = 0;
  std::string deepspeed_config_json;
  // The ranks this daemon serves (sorted, unique); empty = all of them.
  std::vector<uint32_t> local_ranks;
  // Steps are decided by PrepareStep/CommitStep (several daemons, one job).
  bool external_step_agreement = false;
  bool IsLocal(uint32_t rank) const;
  std::vector<std::string> warnings;  // unknown DeepSpeed keys
};

// InvalidArgument naming the field for: empty or over-long name, world_size
// outside 1..4096, an unknown mode or dtype, a DeepSpeed config that does not
// parse, offload mode with stage 0 or 3 with param offload, infinity mode
// without stage 3, bad optimizer hyperparameters, local_ranks out of range or
// repeated.
absl::StatusOr<JobSettings> ResolveJobSettings(const strata::v1::CreateJobRequest& request);

// The proto form, for checkpoints.
strata::v1::CreateJobRequest JobSettingsToRequest(const JobSettings& settings);

}  // namespace strata

#endif  // STRATA_DAEMON_JOB_SETTINGS_H_
