// JobRecord: what identifies a job's progress apart from its shard data --
// settings, tensors, step counts, loss-scaler state -- and its JSON form, used
// both by checkpoint manifests and by the NVMe record of ZeRO-Infinity jobs.
#ifndef STRATA_DAEMON_JOB_RECORD_H_
#define STRATA_DAEMON_JOB_RECORD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/zero_partition.h"
#include "daemon/loss_scaler.h"
#include "strata/v1/strata.pb.h"

namespace strata {

struct JobRecord {
  strata::v1::CreateJobRequest settings;
  std::vector<TensorSpec> tensors;  // ids are the registration order
  uint64_t next_step = 0;
  uint64_t optimizer_steps = 0;
  LossScalerState loss_scaler;
  std::vector<uint32_t> groups;  // param group per tensor (empty: all 0)
  // The per-group hyperparameters last set by BeginStep (empty: the job's).
  std::vector<strata::v1::GroupHyperparams> group_hyperparams;
  // Trainer-supplied partitions per rank (empty: the daemon's own).
  std::vector<std::vector<ShardLayout>> partitions;
};

// A JSON object; `format`, when not empty, is stored under "format".
std::string SerializeJobRecord(const JobRecord& record, const std::string& format = "");
// DataLoss naming `what` (a path, "the NVMe record of job 7") when the text is
// not a record (or not of `format`, when given).
absl::StatusOr<JobRecord> ParseJobRecord(const std::string& text, const std::string& what,
                                         const std::string& format = "");

}  // namespace strata

#endif  // STRATA_DAEMON_JOB_RECORD_H_
