// StrataService: the gRPC handlers of strata.v1.Strata. Thin: each resolves
// the caller's session, calls the job or the registry, and maps the Status.
#ifndef STRATA_DAEMON_STRATA_SERVICE_H_
#define STRATA_DAEMON_STRATA_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "daemon/caller.h"
#include "daemon/checkpoint_quota.h"
#include "daemon/daemon_config.h"
#include "daemon/device_arena.h"
#include "daemon/job_registry.h"
#include "strata/v1/strata.grpc.pb.h"

namespace strata {

struct ServiceContext {
  JobRegistry* registry = nullptr;
  JobServices services;
  strata::v1::DaemonConfig effective_config;
  std::vector<std::string> startup_choices;
  std::string fd_socket_path;
  absl::Duration lease_timeout;
  // Tier-level stats for GetStats (filled by the daemon).
  std::function<std::vector<strata::v1::TierStats>()> tier_stats;
  // Called by Drain: stop accepting, finish steps, flush.
  std::function<void()> drain;
  // Hardening (docs/SECURITY.md): who calls, the caps, where checkpoints go.
  const CallerResolver* callers = nullptr;  // required
  RequestLimits limits;
  std::string checkpoint_root;  // empty: checkpoints refused
  // Each non-admin caller's bytes under its checkpoint home (required with a
  // checkpoint_root).
  CheckpointQuota* checkpoint_quota = nullptr;
  // The daemon's own uid: what it saves for itself keeps its owner.
  uid_t daemon_uid = 0;
  // The device tier (nullptr: none), for AttachRank's DeviceArenaShare.
  const DeviceArena* device = nullptr;
};

class StrataService final : public strata::v1::Strata::Service {
 public:
  explicit StrataService(ServiceContext context) : ctx_(std::move(context)) {}

  grpc::Status GetStatus(grpc::ServerContext*, const strata::v1::GetStatusRequest*,
                         strata::v1::GetStatusResponse*) override;
  grpc::Status Noop(grpc::ServerContext*, const strata::v1::NoopRequest*, strata::v1::NoopResponse*) override;
  grpc::Status CreateJob(grpc::ServerContext*, const strata::v1::CreateJobRequest*,
                         strata::v1::CreateJobResponse*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const strata::v1::ListJobsRequest*,
                        strata::v1::ListJobsResponse*) override;
  grpc::Status DeleteJob(grpc::ServerContext*, const strata::v1::DeleteJobRequest*,
                         strata::v1::DeleteJobResponse*) override;
  grpc::Status AttachRank(grpc::ServerContext*, const strata::v1::AttachRankRequest*,
                          strata::v1::AttachRankResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const strata::v1::HeartbeatRequest*,
                         strata::v1::HeartbeatResponse*) override;
  grpc::Status DetachRank(grpc::ServerContext*, const strata::v1::DetachRankRequest*,
                          strata::v1::DetachRankResponse*) override;
  grpc::Status RegisterTensors(grpc::ServerContext*, const strata::v1::RegisterTensorsRequest*,
                               strata::v1::RegisterTensorsResponse*) override;
  grpc::Status InitParams(grpc::ServerContext*, const strata::v1::InitParamsRequest*,
                          strata::v1::InitParamsResponse*) override;
  grpc::Status GradReady(grpc::ServerContext*, const strata::v1::GradReadyRequest*,
                         strata::v1::GradReadyResponse*) override;
  grpc::Status WaitStep(grpc::ServerContext*, const strata::v1::WaitStepRequest*,
                        strata::v1::WaitStepResponse*) override;
  grpc::Status BeginStep(grpc::ServerContext*, const strata::v1::BeginStepRequest*,
                         strata::v1::BeginStepResponse*) override;
  grpc::Status PrepareStep(grpc::ServerContext*, const strata::v1::PrepareStepRequest*,
                           strata::v1::PrepareStepResponse*) override;
  grpc::Status CommitStep(grpc::ServerContext*, const strata::v1::CommitStepRequest*,
                          strata::v1::CommitStepResponse*) override;
  grpc::Status Acquire(grpc::ServerContext*, const strata::v1::AcquireRequest*,
                       strata::v1::AcquireResponse*) override;
  grpc::Status Release(grpc::ServerContext*, const strata::v1::ReleaseRequest*,
                       strata::v1::ReleaseResponse*) override;
  grpc::Status IterationBoundary(grpc::ServerContext*, const strata::v1::IterationBoundaryRequest*,
                                 strata::v1::IterationBoundaryResponse*) override;
  grpc::Status ParkJob(grpc::ServerContext*, const strata::v1::ParkJobRequest*,
                       strata::v1::ParkJobResponse*) override;
  grpc::Status ResumeJob(grpc::ServerContext*, const strata::v1::ResumeJobRequest*,
                         strata::v1::ResumeJobResponse*) override;
  grpc::Status SaveCheckpoint(grpc::ServerContext*, const strata::v1::SaveCheckpointRequest*,
                              strata::v1::SaveCheckpointResponse*) override;
  grpc::Status LoadCheckpoint(grpc::ServerContext*, const strata::v1::LoadCheckpointRequest*,
                              strata::v1::LoadCheckpointResponse*) override;
  grpc::Status GetStats(grpc::ServerContext*, const strata::v1::GetStatsRequest*,
                        strata::v1::GetStatsResponse*) override;
  grpc::Status Drain(grpc::ServerContext*, const strata::v1::DrainRequest*, strata::v1::DrainResponse*) override;

 private:
  void FillJobInfo(const Job& job, strata::v1::JobInfo* info) const;
  // The caller of `context`, or Unauthenticated.
  absl::StatusOr<Caller> Identify(grpc::ServerContext* context) const;
  // The caller's session `session_id` (NotFound for another uid's).
  absl::StatusOr<SessionRef> SessionFor(grpc::ServerContext* context, uint64_t session_id);
  ServiceContext ctx_;
  // Blocking WaitStep/Acquire calls now parked (capped by max_pending_waits).
  std::atomic<uint32_t> pending_waits_{0};
};

}  // namespace strata

#endif  // STRATA_DAEMON_STRATA_SERVICE_H_
