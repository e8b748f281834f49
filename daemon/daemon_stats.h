// What the daemon reports about itself: per tier (GetStats' TierStats) and
// per job and tier in Prometheus' text format (the metrics endpoint).
// Snapshots only: nothing here holds a lock across another call.
#ifndef STRATA_DAEMON_DAEMON_STATS_H_
#define STRATA_DAEMON_DAEMON_STATS_H_

#include <string>
#include <vector>

#include "daemon/device_arena.h"
#include "daemon/job.h"
#include "daemon/job_registry.h"
#include "daemon/pinned_budget.h"
#include "strata/v1/strata.pb.h"
#include "swap/extent_store.h"

namespace strata {

// `nvme` is null when the daemon has no NVMe tier, `device` without a device
// tier (--device none).
std::vector<strata::v1::TierStats> CollectTierStats(const ExtentStore* nvme, const PinnedBudget& pinned,
                                                    const DeviceArena* device = nullptr);

// A job's rows of GetStats (and of the metrics' per-tier series): "pinned"
// (its window, or its reservation for an Offload job), "device" when it has
// a device budget, "nvme" for an Infinity job. The pinned and device rows
// count the acquires into their own tier.
std::vector<strata::v1::JobTierStats> JobTierRows(const Job& job, const JobCounters& c);

// The job's last applied step's breakdown (GetStats' JobStats.last_step).
strata::v1::StepTimes StepTimesProto(const StepTimes& t);

// Every tier's and every job's gauges and counters, one HELP/TYPE block per
// metric, jobs labelled by name.
std::string RenderMetrics(const JobRegistry& registry, const ExtentStore* nvme, const PinnedBudget& pinned,
                          const DeviceArena* device = nullptr);

}  // namespace strata

#endif  // STRATA_DAEMON_DAEMON_STATS_H_
