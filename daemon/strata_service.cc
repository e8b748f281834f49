#include "daemon/strata_service.h"

#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"
#include "daemon/checkpoint_dir.h"
#include "daemon/daemon_stats.h"
#include "daemon/grpc_status.h"
#include "daemon/job_proto.h"

namespace strata {
namespace {

// The latest a call may block: the client's deadline, capped so a client
// without one still gets an answer.
absl::Time CallDeadline(grpc::ServerContext* context, absl::Duration cap) {
  const absl::Time cap_at = absl::Now() + cap;
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return cap_at;
  return std::min(cap_at, absl::FromChrono(deadline));
}

// Counts a parked blocking call; the cap keeps a flood of waits from tying
// up the server's threads.
class PendingWait {
 public:
  PendingWait(std::atomic<uint32_t>* counter, uint32_t cap) : counter_(counter) {
    admitted_ = counter_->fetch_add(1) < cap;
  }
  ~PendingWait() { counter_->fetch_sub(1); }
  bool admitted() const { return admitted_; }

 private:
  std::atomic<uint32_t>* counter_;
  bool admitted_ = false;
};

// The wire's tier enum, checked: proto3 enums carry any int32, so a value
// outside the enum is InvalidArgument naming the field.
absl::StatusOr<TierKind> TierFromProto(int value, absl::string_view field, bool unspecified_ok,
                                       TierKind unspecified_means) {
  switch (value) {
    case strata::v1::TIER_UNSPECIFIED:
      if (unspecified_ok) return unspecified_means;
      break;
    case strata::v1::TIER_DEVICE:
      return TierKind::kDevice;
    case strata::v1::TIER_PINNED_HOST:
      return TierKind::kPinnedHost;
    case strata::v1::TIER_NVME:
      return TierKind::kNvme;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", value, " is not a tier (TIER_DEVICE=1, TIER_PINNED_HOST=2, TIER_NVME=3)"));
  }
  return absl::InvalidArgumentError(absl::StrCat(field, ": a tier is required"));
}

strata::v1::Tier TierToProto(TierKind kind) {
  switch (kind) {
    case TierKind::kDevice: return strata::v1::TIER_DEVICE;
    case TierKind::kPinnedHost: return strata::v1::TIER_PINNED_HOST;
    case TierKind::kNvme: return strata::v1::TIER_NVME;
  }
  return strata::v1::TIER_UNSPECIFIED;
}

// A job name from a request: longer than any name could be is refused
// before it is looked up (or echoed into an error larger than gRPC's
// trailer limit).
absl::Status CheckJobName(const std::string& name, const RequestLimits& limits) {
  if (name.size() > limits.max_name_length) {
    return absl::InvalidArgumentError(absl::StrCat("job: a name of ", name.size(),
                                                   " bytes exceeds max_name_length (", limits.max_name_length, ")"));
  }
  return absl::OkStatus();
}

absl::Status TooManyWaits(uint32_t cap) {
  return absl::ResourceExhaustedError(
      absl::StrCat("max_pending_waits (", cap, ") blocking calls are already waiting; retry later"));
}

}  // namespace

absl::StatusOr<Caller> StrataService::Identify(grpc::ServerContext* context) const {
  if (ctx_.callers == nullptr) return absl::InternalError("the service has no caller resolver");
  return ctx_.callers->Resolve(*context);
}

absl::StatusOr<SessionRef> StrataService::SessionFor(grpc::ServerContext* context, uint64_t session_id) {
  auto caller = Identify(context);
  if (!caller.ok()) return caller.status();
  return ctx_.registry->Touch(session_id, *caller);
}

void StrataService::FillJobInfo(const Job& job, strata::v1::JobInfo* info) const {
  info->set_job_id(job.id());
  info->set_name(job.settings().name);
  info->set_world_size(job.settings().world_size);
  info->set_mode(JobModeToProto(job.settings().mode));
  info->set_stage(job.settings().stage);
  info->set_attached_ranks(ctx_.registry->AttachedRanks(job.id()));
  info->set_step(job.next_step());
  info->set_params(job.params());
  const StateStaging staging = job.counters().staging;
  info->set_nvme_tile_bytes(staging.tile_bytes);
  info->set_nvme_staging_bytes(staging.bytes);
  info->set_loss_scale(job.loss_scale());
  info->set_skipped_steps(job.counters().steps_skipped);
  info->set_shards_stepped_early(job.counters().shards_stepped_early);
}

grpc::Status StrataService::GetStatus(grpc::ServerContext* context, const strata::v1::GetStatusRequest*,
                                      strata::v1::GetStatusResponse* response) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  response->set_version("0.1.0");
  response->set_pid(getpid());
  response->set_draining(ctx_.registry->draining());
  *response->mutable_config() = ctx_.effective_config;
  for (const std::string& c : ctx_.startup_choices) response->add_startup_choices(c);
  response->set_jobs(static_cast<uint32_t>(ctx_.registry->JobsOf(*caller).size()));
  if (ctx_.tier_stats) {
    for (auto& t : ctx_.tier_stats()) *response->add_tiers() = t;
  }
  const CheckpointScope scope = ScopeFor(ctx_.checkpoint_root, caller->uid, caller->admin, ctx_.daemon_uid);
  response->set_checkpoint_home(scope.HomePath());
  if (!caller->admin && ctx_.checkpoint_quota != nullptr && !scope.root.empty()) {
    const uint64_t limit = ctx_.checkpoint_quota->LimitAt(scope.root);
    response->set_checkpoint_quota_bytes(limit == CheckpointQuota::kNoLimit ? 0 : limit);
  }
  return grpc::Status::OK;
}

grpc::Status StrataService::Noop(grpc::ServerContext* context, const strata::v1::NoopRequest*,
                                 strata::v1::NoopResponse*) {
  return ToGrpcStatus(Identify(context).status());
}

grpc::Status StrataService::CreateJob(grpc::ServerContext* context, const strata::v1::CreateJobRequest* request,
                                      strata::v1::CreateJobResponse* response) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (request->world_size() > ctx_.limits.max_world_size) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "world_size ", request->world_size(), " exceeds max_world_size (", ctx_.limits.max_world_size, ")")));
  }
  auto settings = ResolveJobSettings(JobRequestFromProto(*request));
  if (!settings.ok()) return ToGrpcStatus(settings.status());
  settings->owner_uid = caller->uid;
  auto created = ctx_.registry->CreateJob(std::move(*settings), request->attach_if_exists(), *caller);
  if (!created.ok()) return ToGrpcStatus(created.status());
  response->set_job_id(created->first->id());
  response->set_existed(created->second);
  return grpc::Status::OK;
}

grpc::Status StrataService::ListJobs(grpc::ServerContext* context, const strata::v1::ListJobsRequest*,
                                     strata::v1::ListJobsResponse* response) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  for (const auto& job : ctx_.registry->JobsOf(*caller)) FillJobInfo(*job, response->add_jobs());
  return grpc::Status::OK;
}

grpc::Status StrataService::DeleteJob(grpc::ServerContext* context, const strata::v1::DeleteJobRequest* request,
                                      strata::v1::DeleteJobResponse*) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ToGrpcStatus(ctx_.registry->DeleteJob(request->job(), *caller));
}

grpc::Status StrataService::AttachRank(grpc::ServerContext* context, const strata::v1::AttachRankRequest* request,
                                       strata::v1::AttachRankResponse* response) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  auto attached = ctx_.registry->Attach(request->job(), request->rank(), *caller);
  if (!attached.ok()) return ToGrpcStatus(attached.status());
  response->set_job_id(attached->job->id());
  response->set_session_id(attached->session_id);
  response->set_fd_token(attached->fd_token);
  response->set_fd_socket_path(ctx_.fd_socket_path);
  response->set_lease_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(ctx_.lease_timeout)));
  response->set_reattached(attached->reattached);
  response->set_registered(attached->job->registered());
  response->set_step(attached->job->next_step());
  if (ctx_.device != nullptr && attached->job->settings().device_budget_bytes > 0) {
    // Once per session: how this rank maps its job's own device arena (no
    // other job's memory is reachable through it).
    auto share = ctx_.device->tier()->Share(JobId(attached->job->id()));
    if (!share.ok()) return ToGrpcStatus(share.status());
    auto* device = response->mutable_device();
    device->set_bytes(share->bytes);
    if (share->device.kind == DeviceExport::Kind::kMemfd) {
      device->set_kind("memfd");
    } else {
      device->set_kind("cuda_ipc");
      device->set_cuda_ipc_handle(share->device.cuda_ipc_handle);
      device->set_cuda_offset(share->device.offset);
      device->set_device_ordinal(share->device.device_ordinal);
    }
  }
  return grpc::Status::OK;
}

grpc::Status StrataService::Heartbeat(grpc::ServerContext* context, const strata::v1::HeartbeatRequest* request,
                                      strata::v1::HeartbeatResponse*) {
  return ToGrpcStatus(SessionFor(context, request->session_id()).status());
}

grpc::Status StrataService::DetachRank(grpc::ServerContext* context, const strata::v1::DetachRankRequest* request,
                                       strata::v1::DetachRankResponse*) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  return ToGrpcStatus(ctx_.registry->Detach(request->session_id(), *caller));
}

grpc::Status StrataService::RegisterTensors(grpc::ServerContext* context, const strata::v1::RegisterTensorsRequest* request,
                                            strata::v1::RegisterTensorsResponse* response) {
  auto session = SessionFor(context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  if (static_cast<uint64_t>(request->tensors_size()) > ctx_.limits.max_tensors_per_job) {
    return ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat("tensors: ", request->tensors_size(),
                                                                  " tensors exceed max_tensors_per_job (",
                                                                  ctx_.limits.max_tensors_per_job, ")")));
  }
  std::vector<TensorSpec> tensors;
  std::vector<uint32_t> groups;
  for (int i = 0; i < request->tensors_size(); ++i) {
    const auto& t = request->tensors(i);
    tensors.push_back(TensorSpec{TensorId(static_cast<uint32_t>(i)), t.name(), t.numel()});
    groups.push_back(t.group());
  }
  std::vector<ShardLayout> partition;
  for (const auto& in : request->partition()) {
    ShardLayout shard;
    shard.index = in.index();
    shard.padded_numel = in.padded_numel();
    for (const auto& r : in.ranges()) {
      shard.ranges.push_back(OwnedRange{TensorId(r.tensor()), r.tensor_offset(), r.numel(), r.shard_offset()});
    }
    partition.push_back(std::move(shard));
  }
  // Caps and checked sums before the job allocates anything.
  if (absl::Status s = ValidateTensorList(ctx_.limits, tensors); !s.ok()) return ToGrpcStatus(s);
  Job& job = *session->job;
  if (absl::Status s = job.Register(session->rank, tensors, groups, partition); !s.ok()) return ToGrpcStatus(s);
  for (const ExchangeSlot& slot : job.SlotsOf(session->rank)) {
    auto* out = response->add_shards();
    out->set_index(slot.layout.index);
    out->set_padded_numel(slot.layout.padded_numel);
    out->set_grad_offset(slot.grad_offset);
    out->set_param_offset(slot.param_offset);
    for (const OwnedRange& r : slot.layout.ranges) {
      auto* range = out->add_ranges();
      range->set_tensor(r.tensor.value());
      range->set_tensor_offset(r.tensor_offset);
      range->set_numel(r.numel);
      range->set_shard_offset(r.shard_offset);
    }
  }
  response->set_region_bytes(job.ExchangeBytesOf(session->rank));
  response->set_param_dtype(std::string(DTypeName(job.settings().param_dtype)));
  response->set_grad_dtype(std::string(DTypeName(job.settings().grad_dtype)));
  response->set_stage(job.settings().stage);
  response->set_init_batch_bytes(job.InitBatchBytes());
  if (ctx_.services.doorbells != nullptr) response->set_doorbell_bytes(doorbell::kBytes);
  return grpc::Status::OK;
}

grpc::Status StrataService::InitParams(grpc::ServerContext* context, const strata::v1::InitParamsRequest* request,
                                       strata::v1::InitParamsResponse*) {
  auto session = SessionFor(context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  const std::vector<uint32_t> indices(request->shard_indices().begin(), request->shard_indices().end());
  return ToGrpcStatus(session->job->InitParams(session->rank, indices));
}

grpc::Status StrataService::GradReady(grpc::ServerContext* context, const strata::v1::GradReadyRequest* request,
                                      strata::v1::GradReadyResponse*) {
  auto session = SessionFor(context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  return ToGrpcStatus(session->job->GradReady(session->rank, request->index(), request->step()));
}

namespace {

// A blocking call for a step beyond the next one cannot be satisfied soon:
// refused instead of parking a thread on it (WaitStep, PrepareStep).
absl::Status WithinOneStep(const Job& job, uint64_t step) {
  const uint64_t at = job.next_step();
  if (step <= at + 1) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("step ", step, " is more than one step ahead of the job (at step ",
                                                    at, "); wait for step ", at, " or ", at + 1));
}

}  // namespace

grpc::Status StrataService::WaitStep(grpc::ServerContext* context, const strata::v1::WaitStepRequest* request,
                                     strata::v1::WaitStepResponse* response) {
  auto session = SessionFor(context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  if (absl::Status s = WithinOneStep(*session->job, request->step()); !s.ok()) return ToGrpcStatus(s);
  PendingWait pending(&pending_waits_, ctx_.limits.max_pending_waits);
  if (!pending.admitted()) return ToGrpcStatus(TooManyWaits(ctx_.limits.max_pending_waits));
  auto outcome = session->job->WaitStep(request->step(), CallDeadline(context, absl::Minutes(10)));
  if (!outcome.ok()) return ToGrpcStatus(outcome.status());
  response->set_skipped(outcome->skipped);
  response->set_loss_scale(outcome->next_loss_scale);
  response->set_grad_norm(outcome->grad_norm);
  response->set_optimizer_steps(outcome->optimizer_steps);
  return grpc::Status::OK;
}

grpc::Status StrataService::BeginStep(grpc::ServerContext* context, const strata::v1::BeginStepRequest* request,
                                      strata::v1::BeginStepResponse*) {
  auto session = SessionFor(context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  return ToGrpcStatus(session->job->BeginStep(request->step(), GroupHyperparamsFromProto(request->groups())));
}

grpc::Status StrataService::PrepareStep(grpc::ServerContext* context, const strata::v1::PrepareStepRequest* request,
                                        strata::v1::PrepareStepResponse* response) {
  auto session = SessionFor(context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  if (absl::Status s = WithinOneStep(*session->job, request->step()); !s.ok()) return ToGrpcStatus(s);
  PendingWait pending(&pending_waits_, ctx_.limits.max_pending_waits);
  if (!pending.admitted()) return ToGrpcStatus(TooManyWaits(ctx_.limits.max_pending_waits));
  auto stats = session->job->PrepareStep(request->step(), CallDeadline(context, absl::Minutes(10)));
  if (!stats.ok()) return ToGrpcStatus(stats.status());
  response->set_overflow(stats->overflow);
  response->set_squared_norm(stats->squared_norm);
  return grpc::Status::OK;
}

grpc::Status StrataService::CommitStep(grpc::ServerContext* context, const strata::v1::CommitStepRequest* request,
                                       strata::v1::CommitStepResponse*) {
  auto session = SessionFor(context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  return ToGrpcStatus(
      session->job->CommitStep(request->step(), StepStats{request->overflow(), request->squared_norm()}));
}

grpc::Status StrataService::Acquire(grpc::ServerContext* context, const strata::v1::AcquireRequest* request,
                                    strata::v1::AcquireResponse* response) {
  auto session = SessionFor(context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  auto tier = TierFromProto(request->tier(), "tier", /*unspecified_ok=*/true, TierKind::kPinnedHost);
  if (!tier.ok()) return ToGrpcStatus(tier.status());
  if (*tier == TierKind::kNvme) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "tier: shards are served from TIER_DEVICE or TIER_PINNED_HOST; TIER_NVME is where they live, not where "
        "a trainer reads them"));
  }
  if (*tier == TierKind::kDevice && session->job->settings().device_budget_bytes == 0) {
    return ToGrpcStatus(absl::FailedPreconditionError(absl::StrCat(
        "Acquire into TIER_DEVICE: job '", session->job->settings().name,
        "' has no device budget (create it with device_budget_bytes > 0 on a daemon with a device tier)")));
  }
  // Each index names a shard of the rank: more than it has is a wrong call
  // (the job checks each index; this bounds the work of a hostile list).
  if (static_cast<uint64_t>(request->indices_size()) > ctx_.limits.max_tensors_per_job) {
    return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat("indices: ", request->indices_size(),
                                                                " indices exceed max_tensors_per_job (",
                                                                ctx_.limits.max_tensors_per_job, ")")));
  }
  std::vector<uint32_t> indices(request->indices().begin(), request->indices().end());
  PendingWait pending(&pending_waits_, ctx_.limits.max_pending_waits);
  if (!pending.admitted()) return ToGrpcStatus(TooManyWaits(ctx_.limits.max_pending_waits));
  const absl::Time deadline = CallDeadline(context, absl::Minutes(2));
  auto places = session->job->AcquireIn(session->rank, indices, *tier, deadline);
  if (!places.ok()) return ToGrpcStatus(places.status());
  for (const ShardPlace& p : *places) {
    auto* out = response->add_places();
    out->set_index(p.index);
    out->set_tier(TierToProto(p.tier));
    out->set_offset(p.offset);
    out->set_bytes(p.bytes);
  }
  return grpc::Status::OK;
}

grpc::Status StrataService::Release(grpc::ServerContext* context, const strata::v1::ReleaseRequest* request,
                                    strata::v1::ReleaseResponse*) {
  auto session = SessionFor(context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  std::vector<uint32_t> indices(request->indices().begin(), request->indices().end());
  return ToGrpcStatus(session->job->Release(session->rank, indices));
}

grpc::Status StrataService::IterationBoundary(grpc::ServerContext* context, const strata::v1::IterationBoundaryRequest* request,
                                              strata::v1::IterationBoundaryResponse*) {
  auto session = SessionFor(context, request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  return ToGrpcStatus(session->job->IterationBoundary(session->rank));
}

grpc::Status StrataService::ParkJob(grpc::ServerContext* context, const strata::v1::ParkJobRequest* request,
                                    strata::v1::ParkJobResponse* response) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  auto tier = TierFromProto(request->tier(), "tier", /*unspecified_ok=*/false, TierKind::kNvme);
  if (!tier.ok()) return ToGrpcStatus(tier.status());
  if (*tier == TierKind::kDevice) {
    return ToGrpcStatus(absl::InvalidArgumentError(
        "tier: a job is parked down to TIER_PINNED_HOST or TIER_NVME (TIER_DEVICE is what parking frees)"));
  }
  if (absl::Status s = CheckJobName(request->job(), ctx_.limits); !s.ok()) return ToGrpcStatus(s);
  // Owner or admin (NotFound / PermissionDenied otherwise, as DeleteJob).
  auto job = ctx_.registry->FindJob(request->job(), *caller);
  if (!job.ok()) return ToGrpcStatus(job.status());
  PendingWait pending(&pending_waits_, ctx_.limits.max_pending_waits);
  if (!pending.admitted()) return ToGrpcStatus(TooManyWaits(ctx_.limits.max_pending_waits));
  auto report = (*job)->Park(*tier);
  if (!report.ok()) return ToGrpcStatus(report.status());
  response->set_tier(TierToProto(report->tier));
  response->set_shards(report->shards);
  response->set_bytes(report->bytes_moved);
  response->set_seconds(report->seconds);
  return grpc::Status::OK;
}

grpc::Status StrataService::ResumeJob(grpc::ServerContext* context, const strata::v1::ResumeJobRequest* request,
                                      strata::v1::ResumeJobResponse* response) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (absl::Status s = CheckJobName(request->job(), ctx_.limits); !s.ok()) return ToGrpcStatus(s);
  auto job = ctx_.registry->FindJob(request->job(), *caller);
  if (!job.ok()) return ToGrpcStatus(job.status());
  PendingWait pending(&pending_waits_, ctx_.limits.max_pending_waits);
  if (!pending.admitted()) return ToGrpcStatus(TooManyWaits(ctx_.limits.max_pending_waits));
  auto report = (*job)->Resume();
  if (!report.ok()) return ToGrpcStatus(report.status());
  response->set_tier(TierToProto(report->tier));
  response->set_shards(report->shards);
  response->set_bytes(report->bytes_moved);
  response->set_seconds(report->seconds);
  return grpc::Status::OK;
}

grpc::Status StrataService::SaveCheckpoint(grpc::ServerContext* context, const strata::v1::SaveCheckpointRequest* request,
                                           strata::v1::SaveCheckpointResponse* response) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // The registry's lock is held only to find the job; the save holds none
  // that another job needs.
  auto job = ctx_.registry->FindJob(request->job(), *caller);
  if (!job.ok()) return ToGrpcStatus(job.status());
  const CheckpointScope scope = ScopeFor(ctx_.checkpoint_root, caller->uid, caller->admin, ctx_.daemon_uid);
  auto place = ResolveCheckpointPlace(scope, request->directory(), /*create_parents=*/true);
  if (!place.ok()) return ToGrpcStatus(place.status());
  auto save = [&](uint64_t room) -> absl::Status {
    auto bytes = (*job)->SaveTo(place->parent.get(), place->leaf, place->display, CheckpointWrite{room, scope.owner});
    if (!bytes.ok()) return bytes.status();
    response->set_bytes(*bytes);
    response->set_path(place->path);
    return absl::OkStatus();
  };
  if (caller->admin || ctx_.checkpoint_quota == nullptr) return ToGrpcStatus(save(CheckpointQuota::kNoLimit));
  // One save of a user at a time, each bounded by what its home leaves of
  // its quota as measured under the same lock.
  absl::MutexLock lock(ctx_.checkpoint_quota->SaveLockOf(caller->uid));
  auto limit = ctx_.checkpoint_quota->LimitOn(place->home.get());
  if (!limit.ok()) return ToGrpcStatus(limit.status());
  auto used = BytesBeneath(place->home.get());
  if (!used.ok()) return ToGrpcStatus(used.status());
  if (*limit != CheckpointQuota::kNoLimit && *used >= *limit) {
    return ToGrpcStatus(absl::ResourceExhaustedError(absl::StrCat(
        "your checkpoint home ", scope.HomePath(), " holds ", FormatBytes(*used), " of your ", FormatBytes(*limit),
        " checkpoint quota; remove old checkpoints there, or ask the operator to raise stratad's --checkpoint_quota")));
  }
  return ToGrpcStatus(save(*limit == CheckpointQuota::kNoLimit ? *limit : *limit - *used));
}

grpc::Status StrataService::LoadCheckpoint(grpc::ServerContext* context, const strata::v1::LoadCheckpointRequest* request,
                                           strata::v1::LoadCheckpointResponse* response) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (ctx_.registry->draining()) {
    return ToGrpcStatus(absl::UnavailableError("the daemon is draining and accepts no new jobs"));
  }
  auto place = ResolveCheckpointPlace(ScopeFor(ctx_.checkpoint_root, caller->uid, caller->admin, ctx_.daemon_uid),
                                      request->directory(), /*create_parents=*/false);
  if (!place.ok()) return ToGrpcStatus(place.status());
  auto dir = OpenCheckpointDir(*place);
  if (!dir.ok()) return ToGrpcStatus(dir.status());
  auto id = ctx_.registry->NextJobId();
  if (!id.ok()) return ToGrpcStatus(id.status());
  const Caller who = *caller;
  const std::string display = place->display;
  auto may_load = [who, display](std::optional<uint32_t> owner) -> absl::Status {
    if (who.admin || (owner.has_value() && *owner == who.uid)) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint ", display, " was saved by ",
        owner.has_value() ? absl::StrCat("uid ", *owner) : std::string("an unrecorded owner"), "; uid ", who.uid,
        " may not load it (only its owner, root, the daemon's user or the admin group may)"));
  };
  auto job = Job::LoadFrom(*id, dir->get(), place->display, request->job_name(), caller->uid, may_load,
                           ctx_.services);
  if (!job.ok()) return ToGrpcStatus(job.status());
  const uint64_t job_id = (*job)->id();
  std::shared_ptr<Job> loaded = std::move(*job);
  if (absl::Status s = ctx_.registry->AddJob(loaded); !s.ok()) {
    // An Infinity load is already committed to NVMe: remove it again, or it
    // would come back at the next start in place of the job holding the name.
    (void)loaded->Retire();
    return ToGrpcStatus(s);
  }
  response->set_job_id(job_id);
  return grpc::Status::OK;
}

grpc::Status StrataService::GetStats(grpc::ServerContext* context, const strata::v1::GetStatsRequest*,
                                     strata::v1::GetStatsResponse* response) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (ctx_.tier_stats) {
    for (auto& t : ctx_.tier_stats()) *response->add_tiers() = t;
  }
  for (const auto& job : ctx_.registry->JobsOf(*caller)) {
    auto* js = response->add_jobs();
    FillJobInfo(*job, js->mutable_job());
    const JobCounters c = job->counters();
    js->set_last_step_s(c.last_step_s);
    const uint64_t steps = c.steps_applied + c.steps_skipped;
    js->set_mean_step_s(steps == 0 ? 0 : c.total_step_s / static_cast<double>(steps));
    js->set_stall_s(c.params.stall_s);
    js->set_nvme_read_bytes(c.params.bytes_read);
    js->set_nvme_write_bytes(c.params.bytes_written);
    js->set_pinned_bytes(c.pinned_reserved_bytes);
    for (auto& row : JobTierRows(*job, c)) *js->add_tiers() = std::move(row);
    *js->mutable_last_step() = StepTimesProto(c.last_step);
  }
  return grpc::Status::OK;
}

grpc::Status StrataService::Drain(grpc::ServerContext* context, const strata::v1::DrainRequest*, strata::v1::DrainResponse*) {
  auto caller = Identify(context);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  if (!caller->admin) {
    return ToGrpcStatus(absl::PermissionDeniedError(absl::StrCat(
        "uid ", caller->uid, " may not drain the daemon (only root, the daemon's user or the admin group may)")));
  }
  if (ctx_.drain) ctx_.drain();
  return grpc::Status::OK;
}

}  // namespace strata
