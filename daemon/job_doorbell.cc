// Job's side of the doorbell (daemon/doorbell.h): making a rank's doorbell,
// publishing the step state into every rank's page, and failing the job when
// a trainer writes a wild value. The signals themselves go through
// Job::GradReady, so both paths share every check.
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "daemon/job.h"

namespace strata {

absl::StatusOr<Job::DoorbellFds> Job::OpenDoorbell(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  if (services_.doorbells == nullptr) return absl::UnimplementedError("this daemon offers no doorbell");
  if (!registered_ || rank >= ranks_.size() || !ranks_[rank].built) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " has no shared region yet"));
  }
  if (doorbells_.size() < ranks_.size()) doorbells_.resize(ranks_.size());
  if (doorbells_[rank] == nullptr) {
    DoorbellHandlers handlers;
    handlers.signal = [this, rank](uint32_t index, uint64_t step) { return GradReady(rank, index, step); };
    handlers.fail = [this](const absl::Status& status) { FailFromDoorbell(status); };
    STRATA_ASSIGN_OR_RETURN(
        doorbells_[rank],
        Doorbell::Create(services_.doorbells, absl::StrCat("strata-job", id_, "-rank", rank, "-doorbell"),
                         static_cast<uint32_t>(ranks_[rank].slots.size()), std::move(handlers)));
  }
  PublishDoorbellsLocked();
  const Doorbell& bell = *doorbells_[rank];
  return DoorbellFds{bell.memfd(), bell.eventfd(), bell.bytes()};
}

void Job::PublishDoorbellsLocked() {
  if (doorbells_.empty()) return;
  bool all_initialized = registered_;
  for (const RankState& r : ranks_) all_initialized = all_initialized && r.initialized;
  const uint64_t next_step = barrier_.next_step();
  const uint64_t open = all_initialized && !barrier_.step_queued() ? next_step + 1 : 0;
  const uint32_t flags = (stopping_ ? doorbell::kFlagClosed : 0) | (worker_error_.ok() ? 0 : doorbell::kFlagFailed);
  for (uint32_t rank = 0; rank < doorbells_.size(); ++rank) {
    if (doorbells_[rank] == nullptr) continue;
    doorbells_[rank]->PublishState(open, next_step, flags);
    PublishGradWindowLocked(rank);
  }
}

void Job::PublishGradWindowLocked(uint32_t rank) {
  if (rank >= doorbells_.size() || doorbells_[rank] == nullptr) return;
  const GradWindow w = pipeline_->GradWindowLocked(mu_, rank);
  doorbells_[rank]->PublishGradWindow(w.room, w.keep, w.held);
}

void Job::PublishStepLocked(uint64_t step, const StepOutcome& outcome) {
  for (const std::unique_ptr<Doorbell>& bell : doorbells_) {
    if (bell == nullptr) continue;
    bell->PublishOutcome(DoorbellOutcome{step, outcome.skipped, outcome.next_loss_scale, outcome.grad_norm,
                                         outcome.optimizer_steps});
  }
  PublishDoorbellsLocked();
}

void Job::FailFromDoorbell(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (worker_error_.ok()) {
    worker_error_ = absl::Status(status.code(), absl::StrCat("job '", settings_.name, "' failed: ", status.message()));
  }
  changed_.SignalAll();
  PublishDoorbellsLocked();
}

void Job::CloseDoorbells() {
  std::vector<std::unique_ptr<Doorbell>> bells;
  {
    absl::MutexLock lock(&mu_);
    bells.swap(doorbells_);
  }
  bells.clear();
}

}  // namespace strata
