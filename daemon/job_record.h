// JobRecord: what identifies a job's progress apart from its shard data --
// settings, tensors, step counts, loss-scaler state -- and its JSON form, used
// both by checkpoint manifests and by the NVMe record of ZeRO-Infinity jobs.
// The struct holds the daemon's own types; the JSON is ours to keep readable
// (records written by earlier daemons parse the same).
#ifndef STRATA_DAEMON_JOB_RECORD_H_
#define STRATA_DAEMON_JOB_RECORD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/group_hyperparams.h"
#include "core/zero_partition.h"
#include "daemon/job_settings.h"
#include "daemon/loss_scaler.h"

namespace strata {

struct JobRecord {
  JobRequest settings;  // resolved again when the job is restored
  std::vector<TensorSpec> tensors;  // ids are the registration order
  uint64_t next_step = 0;
  uint64_t optimizer_steps = 0;
  LossScalerState loss_scaler;
  std::vector<uint32_t> groups;  // param group per tensor (empty: all 0)
  // The per-group hyperparameters last set by BeginStep (empty: the job's).
  std::vector<GroupHyperparams> group_hyperparams;
  // Trainer-supplied partitions per rank (empty: the daemon's own).
  std::vector<std::vector<ShardLayout>> partitions;
  // The job's owner; absent in records written before owners were kept.
  std::optional<uint32_t> owner_uid;
};

// A JSON object; `format`, when not empty, is stored under "format".
std::string SerializeJobRecord(const JobRecord& record, const std::string& format = "");
// DataLoss naming `what` (a path, "the NVMe record of job 7") when the text is
// not a record (or not of `format`, when given).
absl::StatusOr<JobRecord> ParseJobRecord(const std::string& text, const std::string& what,
                                         const std::string& format = "");

}  // namespace strata

#endif  // STRATA_DAEMON_JOB_RECORD_H_
