// Job recovery at startup: the ZeRO-Infinity jobs an earlier run of the
// daemon left in the NVMe extent store come back at their last committed
// step. What cannot come back is resolved, never a reason to refuse to start:
//  * two records with the same job name (an old store, or a delete that did
//    not reach the disk): the newest record (highest generation) wins, the
//    others' shards are deleted;
//  * shards of a job id without a record (a job whose first commit never
//    happened in a store written before per-job commits): deleted;
//  * a record that does not parse or restore: kept on NVMe, job skipped.
// Each decision is a line in `*log`.
#ifndef STRATA_DAEMON_JOB_RECOVERY_H_
#define STRATA_DAEMON_JOB_RECOVERY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/job.h"
#include "daemon/job_registry.h"

namespace strata {

class ExtentStore;

// Adds the restored jobs to `registry` and reserves their ids. Errors only
// when the store itself fails (a job that cannot be restored is logged).
absl::Status RecoverJobs(ExtentStore* store, const JobServices& services, JobRegistry* registry,
                         std::vector<std::string>* log);

// Job `id` as of its last commit: its record read back from `store` and the
// job rebuilt from it (its states and params stay on NVMe). Used to reload a
// job whose step failed on an NVMe fault (JobRegistry::Attach).
absl::StatusOr<std::unique_ptr<Job>> RestoreCommittedJob(ExtentStore* store, uint64_t id,
                                                         const JobServices& services);

}  // namespace strata

#endif  // STRATA_DAEMON_JOB_RECOVERY_H_
