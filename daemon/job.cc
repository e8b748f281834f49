// Job, part 1: its lifecycle (Create, Stop, Restore, Retire), the step
// protocol the service calls (GradReady, PrepareStep, CommitStep, WaitStep),
// its durable record and the param reads (Acquire, Release). How tensors
// become shards is in job_layout.cc; the turn that inspects gradients and
// runs the step, in job_step.cc.
#include "daemon/job.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "swap/aligned_buffer.h"
#include "swap/extent_store.h"

namespace strata {

absl::StatusOr<std::unique_ptr<Job>> Job::Create(uint64_t id, JobSettings settings, JobServices services) {
  if (services.optimizer == nullptr) return absl::InternalError("job created without a CPU optimizer");
  std::unique_ptr<JobDeviceArena> device_arena;
  if (settings.device_budget_bytes > 0 && services.device != nullptr) {
    // The job's own device memory, of its budget: shared with its trainers
    // only (a trainer never maps another job's params).
    STRATA_ASSIGN_OR_RETURN(device_arena, services.device->OpenJob(JobId(id), settings.device_budget_bytes));
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<StepPipeline> pipeline, MakeStepPipeline(id, settings, services));
  std::unique_ptr<Job> job(new Job(id, std::move(settings), services, std::move(pipeline)));
  job->device_arena_ = std::move(device_arena);
  if (job->workers_ == nullptr) {
    STRATA_ASSIGN_OR_RETURN(job->own_workers_, ThreadPoolExecutor::Create(1));
    job->workers_ = job->own_workers_.get();
  }
  return job;
}

Job::Job(uint64_t id, JobSettings settings, JobServices services, std::unique_ptr<StepPipeline> pipeline)
    : id_(id),
      settings_(std::move(settings)),
      services_(services),
      slot_dtypes_{settings_.param_dtype, settings_.grad_dtype},
      pipeline_(std::move(pipeline)),
      regions_(slot_dtypes_),
      scaler_(settings_.loss_scale),
      workers_(services.workers) {}

Job::~Job() {
  CloseDoorbells();
  Stop();
  // The cache's I/O thread reads into the ranks' exchange regions: stop it
  // before those are unmapped (members are destroyed after this body).
  pipeline_->CloseWindow();
  // Writes never committed (a failed step, a load or registration cut
  // short) must not be committed by anyone else later: drop them.
  if (pipeline_->durable()) {
    absl::MutexLock lock(&commit_mu_);
    if (superseded_) return;  // the shards are its replacement's now
    services_.nvme->Rollback(id_);
    if (retired_) (void)services_.nvme->DeleteOwner(id_);  // writes that raced the delete
  }
}

bool Job::NeedsReload() const {
  absl::MutexLock lock(&mu_);
  return reload_needed_;
}

void Job::Supersede() {
  Stop();
  // The reloaded copy of this job takes its shards' place in the daemon's
  // param store (same keys): this one's leave it first.
  if (ParamCache* params = pipeline_->params(); params != nullptr) params->Detach();
  absl::MutexLock states_lock(&states_mu_);  // a pass in progress (InitParams) ends first
  absl::MutexLock lock(&commit_mu_);
  if (superseded_ || !pipeline_->durable()) return;
  services_.nvme->Rollback(id_);
  superseded_ = true;
}

void Job::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  changed_.SignalAll();
  PublishDoorbellsLocked();
  // Queued work finishes first: a step whose gradients are all in is applied
  // (graceful shutdown finishes in-flight steps). Once no turn is left, none
  // is scheduled again, so the pool never calls into a destroyed job.
  while (turn_scheduled_) changed_.Wait(&mu_);
  stopped_ = true;
}

bool Job::registered() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

uint64_t Job::next_step() const {
  absl::MutexLock lock(&mu_);
  return barrier_.next_step();
}

double Job::loss_scale() const {
  absl::MutexLock lock(&mu_);
  return scaler_.scale();
}

JobCounters Job::counters() const {
  JobCounters c;
  {
    absl::MutexLock lock(&mu_);
    c = counters_;
    c.pinned_reserved_bytes = pipeline_->pinned_bytes();
    for (const RankState& r : ranks_) {
      c.pinned_reserved_bytes += r.pinned.bytes();
      if (pipeline_->windowed() && r.built) c.window_resident_bytes += r.exchange.ResidentBytes().value_or(0);
    }
    pipeline_->CountLocked(mu_, c);
    if (states_ != nullptr) c.staging = states_->staging();
  }
  c.params = pipeline_->param_stats();
  return c;
}

uint64_t Job::params() const {
  uint64_t total = 0;
  for (const TensorSpec& t : tensors_) total += t.numel;
  return total;
}

const RequestLimits& Job::Limits() const {
  static const RequestLimits kDefaults;
  return services_.limits != nullptr ? *services_.limits : kDefaults;
}

absl::Status Job::GradReady(uint32_t rank, uint32_t index, uint64_t step) {
  absl::MutexLock lock(&mu_);
  if (!registered_) return absl::FailedPreconditionError("GradReady before RegisterTensors");
  RankState& r = ranks_[rank];
  if (index >= r.slots.size()) {
    return absl::OutOfRangeError(absl::StrCat("shard index ", index, " is out of range: rank ", rank,
                                              " has ", r.slots.size(), " shards"));
  }
  for (uint32_t i = 0; i < ranks_.size(); ++i) {
    if (!ranks_[i].initialized) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GradReady before every rank called InitParams (rank ", i, " has not)"));
    }
  }
  if (!worker_error_.ok()) return worker_error_;
  // A duplicate (see StepBarrier::Accept) changes nothing.
  STRATA_ASSIGN_OR_RETURN(const bool taken, barrier_.Accept(rank, index, step));
  if (!taken) return absl::OkStatus();
  if (!grads_in_start_.has_value()) {
    grads_in_start_ = absl::Now();  // the open step's first gradient
    // The step's state loads need no gradient: the first tiles come in
    // while the rest of the gradients do.
    // (Not where shards are stepped early: those come first, in the order
    // their gradients do.)
    if (pipeline_->durable() && !pipeline_->early_apply()) queue_.push_back(WorkItem{WorkItem::kPreload, 0, 0});
  }
  pipeline_->GradArrivedLocked(mu_, rank, index, r.slots[index]);
  PublishGradWindowLocked(rank);
  // Sending a gradient again replaces it: inspect the new contents.
  if (inspect_queued_.insert({rank, index}).second) {
    queue_.push_back(WorkItem{WorkItem::kInspect, rank, index});
    ++r.grad_work;
  }
  if (barrier_.complete()) {
    if (settings_.external_step_agreement) {
      // The step waits for CommitStep; PrepareStep gets this daemon's share.
      queue_.push_back(WorkItem{WorkItem::kPrepare, 0, 0});
    } else {
      barrier_.QueueStep();
      queue_.push_back(WorkItem{WorkItem::kRunStep, 0, 0});
    }
  }
  ScheduleLocked();
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<StepStats> Job::PrepareStep(uint64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (!settings_.external_step_agreement) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PrepareStep: job '", settings_.name, "' was not created with external_step_agreement"));
  }
  if (step > barrier_.next_step()) {
    return absl::FailedPreconditionError(
        absl::StrCat("PrepareStep for step ", step, " is too early; the job is at step ", barrier_.next_step()));
  }
  while (true) {
    if (const StepStats* prepared = barrier_.Prepared(step)) return *prepared;
    if (!worker_error_.ok()) return worker_error_;
    if (step < barrier_.next_step()) {
      return absl::NotFoundError(absl::StrCat("the local stats of step ", step, " are no longer kept"));
    }
    if (stopping_) return absl::UnavailableError("the daemon is stopping");
    if (changed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("PrepareStep ", step, " of job '", settings_.name,
                                                      "': ", barrier_.grads_missing(), " local gradients are still missing"));
    }
  }
}

absl::Status Job::CommitStep(uint64_t step, const StepStats& global) {
  absl::MutexLock lock(&mu_);
  if (!settings_.external_step_agreement) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CommitStep: job '", settings_.name, "' was not created with external_step_agreement"));
  }
  bool queued = false;
  STRATA_RETURN_IF_ERROR(barrier_.Commit(step, global, &queued));
  if (!queued) return absl::OkStatus();  // an equal commit again
  queue_.push_back(WorkItem{WorkItem::kRunStep, 0, 0});
  ScheduleLocked();
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> Job::WaitStep(uint64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (const StepOutcome* outcome = barrier_.Outcome(step)) return *outcome;
    if (!worker_error_.ok()) return worker_error_;
    if (step < barrier_.next_step()) {
      return absl::NotFoundError(absl::StrCat("the outcome of step ", step, " is no longer kept"));
    }
    if (stopping_) return absl::UnavailableError("the daemon is stopping");
    if (changed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "step ", step, " of job '", settings_.name, "' did not finish in time; ", barrier_.grads_missing(),
          " gradients are still missing"));
    }
  }
}


ShardKey Job::RecordKey(uint64_t job_id) {
  return ShardKey{JobId(job_id), Rank(UINT32_MAX), TensorId(UINT32_MAX), TensorKind::kParam16, 0};
}

bool Job::IsRecordKey(const ShardKey& key) {
  return key.rank == Rank(UINT32_MAX) && key.tensor == TensorId(UINT32_MAX);
}

JobRecord Job::RecordLocked() const {
  JobRecord record;
  record.settings = JobSettingsToRequest(settings_);
  record.tensors = tensors_;
  record.next_step = barrier_.next_step();
  record.optimizer_steps = optimizer_steps_;
  record.loss_scaler = scaler_.state();
  record.groups = group_of_;
  record.group_hyperparams = barrier_.group_hyperparams();
  if (supplied_) record.partitions = supplied_partitions_;
  record.owner_uid = settings_.owner_uid;
  return record;
}

void Job::ApplyRecordLocked(const JobRecord& record) {
  for (RankState& rank : ranks_) rank.initialized = true;
  barrier_.Restore(record.next_step, record.group_hyperparams);
  optimizer_steps_ = record.optimizer_steps;
  scaler_ = LossScaler(settings_.loss_scale, record.loss_scaler);
}

absl::Status Job::WriteRecord(const std::string& record) {
  const uint32_t align = services_.nvme->alignment();
  STRATA_ASSIGN_OR_RETURN(AlignedBuffer buffer, AlignedBuffer::Allocate(record.size(), align));
  std::memcpy(buffer.data(), record.data(), record.size());
  return services_.nvme->Write(RecordKey(id_), absl::Span<const std::byte>(buffer.data(), record.size()));
}

absl::Status Job::CommitWithRecord(const std::string& record) {
  absl::MutexLock lock(&commit_mu_);
  if (superseded_) return absl::FailedPreconditionError(absl::StrCat("job '", settings_.name, "' was reloaded"));
  if (retired_) {
    services_.nvme->Rollback(id_);
    return absl::FailedPreconditionError(absl::StrCat("job '", settings_.name, "' was deleted"));
  }
  absl::Status s = WriteRecord(record);
  if (s.ok()) s = services_.nvme->Commit(id_);
  if (!s.ok()) services_.nvme->Rollback(id_);
  return s;
}

absl::Status Job::Retire() {
  if (!pipeline_->durable()) return absl::OkStatus();
  absl::MutexLock lock(&commit_mu_);
  retired_ = true;
  return services_.nvme->DeleteOwner(id_);
}

absl::StatusOr<std::unique_ptr<Job>> Job::Restore(uint64_t id, const std::string& text, JobServices services) {
  STRATA_ASSIGN_OR_RETURN(JobRecord record, ParseJobRecord(text, absl::StrCat("the NVMe record of job ", id)));
  STRATA_ASSIGN_OR_RETURN(JobSettings settings, ResolveJobSettings(record.settings));
  settings.owner_uid = record.owner_uid.value_or(0);  // no owner recorded: admins only
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Create(id, std::move(settings), services));
  absl::MutexLock lock(&job->mu_);
  STRATA_RETURN_IF_ERROR(job->AdoptTensorsLocked(record));
  job->supplied_ = !record.partitions.empty();
  if (job->supplied_) STRATA_RETURN_IF_ERROR(job->AdmitRecordedPartitionsLocked(record.partitions));
  job->supplied_partitions_ = record.partitions;
  STRATA_RETURN_IF_ERROR(job->BuildLayoutsLocked(record.tensors, /*adopt=*/true,
                                                 job->supplied_ ? &job->supplied_partitions_ : nullptr));
  job->registered_ = true;
  job->ApplyRecordLocked(record);
  return job;
}

absl::Status Job::Acquire(uint32_t rank, const std::vector<uint32_t>& indices, absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (!registered_) return absl::FailedPreconditionError("Acquire before RegisterTensors");
    for (uint32_t index : indices) {
      if (index >= ranks_[rank].slots.size()) {
        return absl::OutOfRangeError(absl::StrCat("shard index ", index, " is out of range: rank ", rank,
                                                  " has ", ranks_[rank].slots.size(), " shards"));
      }
    }
    if (!ranks_[rank].initialized) return absl::FailedPreconditionError("Acquire before InitParams");
  }
  return pipeline_->Acquire(rank, indices, deadline);
}

absl::Status Job::Release(uint32_t rank, const std::vector<uint32_t>& indices) {
  return pipeline_->Release(rank, indices);
}

absl::Status Job::IterationBoundary(uint32_t rank) {
  pipeline_->IterationBoundary(rank);
  return absl::OkStatus();
}

void Job::DropPins(uint32_t rank) {
  pipeline_->DropPins(rank);
}

}  // namespace strata
