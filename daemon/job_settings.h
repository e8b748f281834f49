// JobSettings: what a job is, resolved once from CreateJob (its DeepSpeed
// config plus explicit overrides) and validated. JobRequest is what was asked
// for, before resolving: the daemon's own form of CreateJobRequest (converted
// at the service edge, daemon/job_proto.h), kept in job records and manifests.
#ifndef STRATA_DAEMON_JOB_SETTINGS_H_
#define STRATA_DAEMON_JOB_SETTINGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/deepspeed_config.h"
#include "core/dtype.h"
#include "core/job_mode.h"
#include "optimizer_cpu/hyperparams.h"

namespace strata {

// CreateJob as asked, unvalidated (ResolveJobSettings checks it).
// The optimizer a CreateJob names explicitly, overriding the DeepSpeed
// config's. (Outside JobRequest: clang cannot use a nested class's default
// member initializers inside std::optional before the enclosing class ends.)
struct JobOptimizerRequest {
  std::string type;  // adam, adamw, adagrad, lion; "" = the config's
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  bool amsgrad = false;
  double lr_decay = 0, initial_accumulator_value = 0;  // adagrad
  bool operator==(const JobOptimizerRequest&) const = default;
};

struct JobRequest {
  using Optimizer = JobOptimizerRequest;
  std::string name;
  uint32_t world_size = 0;
  std::optional<JobMode> mode;  // nullopt: none or one this daemon does not know
  std::string deepspeed_config_json;
  std::optional<Optimizer> optimizer;
  std::string param_dtype, grad_dtype;  // "" = the config's precision
  uint64_t pinned_budget_bytes = 0;
  uint64_t device_budget_bytes = 0;
  std::vector<uint32_t> local_ranks;
  bool external_step_agreement = false;
  bool operator==(const JobRequest&) const = default;
};

struct JobSettings {
  std::string name;
  uint32_t world_size = 1;
  JobMode mode = JobMode::kOffload;
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
  // Who created the job (the caller's uid, never the request's word); kept in
  // the job's NVMe record and its checkpoints' manifests.
  uint32_t owner_uid = 0;
};

// InvalidArgument naming the field for: empty or over-long name, world_size
// outside 1..4096, an unknown mode or dtype, a DeepSpeed config that does not
// parse, offload mode with stage 0 or 3 with param offload, infinity mode
// without stage 3, bad optimizer hyperparameters, local_ranks out of range or
// repeated, an optimizer stratad does not step (LAMB, or any unknown type,
// named by the request or the DeepSpeed config), a pinned_budget_bytes above
// 2^50.
absl::StatusOr<JobSettings> ResolveJobSettings(const JobRequest& request);

// The request that resolves to `settings` again, for job records and checkpoints.
JobRequest JobSettingsToRequest(const JobSettings& settings);

}  // namespace strata

#endif  // STRATA_DAEMON_JOB_SETTINGS_H_
