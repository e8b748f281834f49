#include "daemon/strata_service.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "daemon/grpc_status.h"

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

}  // namespace

void StrataService::FillJobInfo(const Job& job, strata::v1::JobInfo* info) const {
  info->set_job_id(job.id());
  info->set_name(job.settings().name);
  info->set_world_size(job.settings().world_size);
  info->set_mode(job.settings().mode);
  info->set_stage(job.settings().stage);
  info->set_attached_ranks(ctx_.registry->AttachedRanks(job.id()));
  info->set_step(job.next_step());
  info->set_params(job.params());
  info->set_loss_scale(job.loss_scale());
  info->set_skipped_steps(job.counters().steps_skipped);
}

grpc::Status StrataService::GetStatus(grpc::ServerContext*, const strata::v1::GetStatusRequest*,
                                      strata::v1::GetStatusResponse* response) {
  response->set_version("0.1.0");
  response->set_pid(getpid());
  response->set_draining(ctx_.registry->draining());
  *response->mutable_config() = ctx_.effective_config;
  for (const std::string& c : ctx_.startup_choices) response->add_startup_choices(c);
  response->set_jobs(static_cast<uint32_t>(ctx_.registry->Jobs().size()));
  return grpc::Status::OK;
}

grpc::Status StrataService::Noop(grpc::ServerContext*, const strata::v1::NoopRequest*, strata::v1::NoopResponse*) {
  return grpc::Status::OK;
}

grpc::Status StrataService::CreateJob(grpc::ServerContext*, const strata::v1::CreateJobRequest* request,
                                      strata::v1::CreateJobResponse* response) {
  auto settings = ResolveJobSettings(*request);
  if (!settings.ok()) return ToGrpcStatus(settings.status());
  auto created = ctx_.registry->CreateJob(std::move(*settings), request->attach_if_exists());
  if (!created.ok()) return ToGrpcStatus(created.status());
  response->set_job_id(created->first->id());
  response->set_existed(created->second);
  return grpc::Status::OK;
}

grpc::Status StrataService::ListJobs(grpc::ServerContext*, const strata::v1::ListJobsRequest*,
                                     strata::v1::ListJobsResponse* response) {
  for (const auto& job : ctx_.registry->Jobs()) FillJobInfo(*job, response->add_jobs());
  return grpc::Status::OK;
}

grpc::Status StrataService::DeleteJob(grpc::ServerContext*, const strata::v1::DeleteJobRequest* request,
                                      strata::v1::DeleteJobResponse*) {
  return ToGrpcStatus(ctx_.registry->DeleteJob(request->job()));
}

grpc::Status StrataService::AttachRank(grpc::ServerContext*, const strata::v1::AttachRankRequest* request,
                                       strata::v1::AttachRankResponse* response) {
  auto attached = ctx_.registry->Attach(request->job(), request->rank());
  if (!attached.ok()) return ToGrpcStatus(attached.status());
  response->set_job_id(attached->job->id());
  response->set_session_id(attached->session_id);
  response->set_fd_token(attached->fd_token);
  response->set_fd_socket_path(ctx_.fd_socket_path);
  response->set_lease_timeout_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(ctx_.lease_timeout)));
  response->set_reattached(attached->reattached);
  response->set_registered(attached->job->registered());
  response->set_step(attached->job->next_step());
  return grpc::Status::OK;
}

grpc::Status StrataService::Heartbeat(grpc::ServerContext*, const strata::v1::HeartbeatRequest* request,
                                      strata::v1::HeartbeatResponse*) {
  return ToGrpcStatus(ctx_.registry->Touch(request->session_id()).status());
}

grpc::Status StrataService::DetachRank(grpc::ServerContext*, const strata::v1::DetachRankRequest* request,
                                       strata::v1::DetachRankResponse*) {
  return ToGrpcStatus(ctx_.registry->Detach(request->session_id()));
}

grpc::Status StrataService::RegisterTensors(grpc::ServerContext*, const strata::v1::RegisterTensorsRequest* request,
                                            strata::v1::RegisterTensorsResponse* response) {
  auto session = ctx_.registry->Touch(request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  std::vector<TensorSpec> tensors;
  std::vector<uint32_t> groups;
  for (int i = 0; i < request->tensors_size(); ++i) {
    const auto& t = request->tensors(i);
    if (t.numel() == 0) {
      return ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " ('", t.name(), "') has 0 elements")));
    }
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
  return grpc::Status::OK;
}

grpc::Status StrataService::InitParams(grpc::ServerContext*, const strata::v1::InitParamsRequest* request,
                                       strata::v1::InitParamsResponse*) {
  auto session = ctx_.registry->Touch(request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  return ToGrpcStatus(session->job->InitParams(session->rank));
}

grpc::Status StrataService::GradReady(grpc::ServerContext*, const strata::v1::GradReadyRequest* request,
                                      strata::v1::GradReadyResponse*) {
  auto session = ctx_.registry->Touch(request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  return ToGrpcStatus(session->job->GradReady(session->rank, request->index(), request->step()));
}

grpc::Status StrataService::WaitStep(grpc::ServerContext* context, const strata::v1::WaitStepRequest* request,
                                     strata::v1::WaitStepResponse* response) {
  auto session = ctx_.registry->Touch(request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  auto outcome = session->job->WaitStep(request->step(), CallDeadline(context, absl::Minutes(10)));
  if (!outcome.ok()) return ToGrpcStatus(outcome.status());
  response->set_skipped(outcome->skipped);
  response->set_loss_scale(outcome->next_loss_scale);
  response->set_grad_norm(outcome->grad_norm);
  response->set_optimizer_steps(outcome->optimizer_steps);
  return grpc::Status::OK;
}

grpc::Status StrataService::BeginStep(grpc::ServerContext*, const strata::v1::BeginStepRequest* request,
                                      strata::v1::BeginStepResponse*) {
  auto session = ctx_.registry->Touch(request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  std::vector<strata::v1::GroupHyperparams> groups(request->groups().begin(), request->groups().end());
  return ToGrpcStatus(session->job->BeginStep(request->step(), groups));
}

grpc::Status StrataService::PrepareStep(grpc::ServerContext* context, const strata::v1::PrepareStepRequest* request,
                                        strata::v1::PrepareStepResponse* response) {
  auto session = ctx_.registry->Touch(request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  auto stats = session->job->PrepareStep(request->step(), CallDeadline(context, absl::Minutes(10)));
  if (!stats.ok()) return ToGrpcStatus(stats.status());
  response->set_overflow(stats->overflow);
  response->set_squared_norm(stats->squared_norm);
  return grpc::Status::OK;
}

grpc::Status StrataService::CommitStep(grpc::ServerContext*, const strata::v1::CommitStepRequest* request,
                                       strata::v1::CommitStepResponse*) {
  auto session = ctx_.registry->Touch(request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  return ToGrpcStatus(
      session->job->CommitStep(request->step(), StepStats{request->overflow(), request->squared_norm()}));
}

grpc::Status StrataService::Acquire(grpc::ServerContext* context, const strata::v1::AcquireRequest* request,
                                    strata::v1::AcquireResponse*) {
  auto session = ctx_.registry->Touch(request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  std::vector<uint32_t> indices(request->indices().begin(), request->indices().end());
  return ToGrpcStatus(session->job->Acquire(session->rank, indices, CallDeadline(context, absl::Minutes(2))));
}

grpc::Status StrataService::Release(grpc::ServerContext*, const strata::v1::ReleaseRequest* request,
                                    strata::v1::ReleaseResponse*) {
  auto session = ctx_.registry->Touch(request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  std::vector<uint32_t> indices(request->indices().begin(), request->indices().end());
  return ToGrpcStatus(session->job->Release(session->rank, indices));
}

grpc::Status StrataService::IterationBoundary(grpc::ServerContext*, const strata::v1::IterationBoundaryRequest* request,
                                              strata::v1::IterationBoundaryResponse*) {
  auto session = ctx_.registry->Touch(request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status());
  return ToGrpcStatus(session->job->IterationBoundary(session->rank));
}

grpc::Status StrataService::SaveCheckpoint(grpc::ServerContext*, const strata::v1::SaveCheckpointRequest* request,
                                           strata::v1::SaveCheckpointResponse*) {
  auto job = ctx_.registry->FindJob(request->job());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (request->directory().empty() || request->directory().front() != '/') {
    return ToGrpcStatus(absl::InvalidArgumentError("checkpoint directory must be an absolute path"));
  }
  return ToGrpcStatus((*job)->SaveTo(request->directory()));
}

grpc::Status StrataService::LoadCheckpoint(grpc::ServerContext*, const strata::v1::LoadCheckpointRequest* request,
                                           strata::v1::LoadCheckpointResponse* response) {
  if (ctx_.registry->draining()) {
    return ToGrpcStatus(absl::UnavailableError("the daemon is draining and accepts no new jobs"));
  }
  auto job = Job::LoadFrom(ctx_.registry->NextJobId(), request->directory(), request->job_name(), ctx_.services);
  if (!job.ok()) return ToGrpcStatus(job.status());
  const uint64_t id = (*job)->id();
  if (absl::Status s = ctx_.registry->AddJob(std::move(*job)); !s.ok()) return ToGrpcStatus(s);
  response->set_job_id(id);
  return grpc::Status::OK;
}

grpc::Status StrataService::GetStats(grpc::ServerContext*, const strata::v1::GetStatsRequest*,
                                     strata::v1::GetStatsResponse* response) {
  if (ctx_.tier_stats) {
    for (auto& t : ctx_.tier_stats()) *response->add_tiers() = t;
  }
  for (const auto& job : ctx_.registry->Jobs()) {
    auto* js = response->add_jobs();
    FillJobInfo(*job, js->mutable_job());
    const JobCounters c = job->counters();
    js->set_last_step_s(c.last_step_s);
    const uint64_t steps = c.steps_applied + c.steps_skipped;
    js->set_mean_step_s(steps == 0 ? 0 : c.total_step_s / static_cast<double>(steps));
    js->set_stall_s(c.params.stall_s);
    js->set_nvme_read_bytes(c.params.bytes_read);
    js->set_nvme_write_bytes(c.params.bytes_written);
  }
  return grpc::Status::OK;
}

grpc::Status StrataService::Drain(grpc::ServerContext*, const strata::v1::DrainRequest*, strata::v1::DrainResponse*) {
  if (ctx_.drain) ctx_.drain();
  return grpc::Status::OK;
}

}  // namespace strata
