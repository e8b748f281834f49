// Job, part 3: the job's turn on the worker pool -- per-gradient
// inspections, the early passes that step shards while gradients come in,
// the state preload, and the step itself (RunStep). One turn at a time per
// job (ScheduleLocked); the gRPC-facing step protocol that queues this work
// is in job.cc.
#include "daemon/job.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "swap/extent_store.h"

namespace strata {

void Job::ScheduleLocked() {
  if (turn_scheduled_ || stopped_ || queue_.empty()) return;
  turn_scheduled_ = true;
  workers_->Schedule([this] { RunTurn(); });
}

void Job::RunTurn() {
  WorkItem item;
  {
    absl::MutexLock lock(&mu_);
    item = queue_.front();  // a turn is scheduled only with work queued
    queue_.pop_front();
  }
  RunItem(item);
  absl::MutexLock lock(&mu_);
  turn_scheduled_ = false;
  ScheduleLocked();      // the next item waits behind other jobs' turns
  changed_.SignalAll();  // Stop waits for the last turn
}

void Job::RunItem(const WorkItem& item) {
  if (item.kind == WorkItem::kInspect) Inspect(item.rank, item.index);
  if (item.kind == WorkItem::kRunStep) RunStep();
  if (item.kind == WorkItem::kPreload) PreloadStates();
  if (item.kind == WorkItem::kEarlySteps) RunEarlySteps();
  if (item.kind == WorkItem::kPrepare) {
    absl::MutexLock lock(&mu_);
    if (barrier_.PrepareOpenStep()) changed_.SignalAll();
  }
  if (item.kind == WorkItem::kInspect) {
    absl::MutexLock lock(&mu_);
    if (item.rank < ranks_.size() && ranks_[item.rank].grad_work > 0) --ranks_[item.rank].grad_work;
  }
}

void Job::Inspect(uint32_t rank, uint32_t index) {
  ExchangeSlot slot;
  {
    absl::MutexLock lock(&mu_);
    inspect_queued_.erase({rank, index});
    slot = ranks_[rank].slots[index];
  }
  GradView grad{regions_.GradSlot(rank, slot), settings_.grad_dtype, slot.layout.padded_numel};
  auto overflow = services_.optimizer->HasInfOrNan(grad);
  auto norm = services_.optimizer->SquaredL2Norm(grad);
  absl::MutexLock lock(&mu_);
  if (!overflow.ok() || !norm.ok()) {
    worker_error_ = !overflow.ok() ? overflow.status() : norm.status();
    changed_.SignalAll();
    PublishDoorbellsLocked();
    return;
  }
  barrier_.Inspected(rank, index, *overflow, *norm);
  // Infinity: keeps the window within its budget, maybe spilling this
  // gradient (mu_ is released while it is written).
  absl::Status fit = pipeline_->AfterInspectLocked(mu_, rank, index, slot);
  PublishGradWindowLocked(rank);
  if (!fit.ok()) {
    worker_error_ = absl::Status(
        fit.code(),
        absl::StrCat(fit.message(), "; nothing of step ", barrier_.next_step(), " of job '", settings_.name,
                     "' was committed (the job's NVMe state is its last commit). Attach its ranks again (Attach, "
                     "RegisterTensors, no InitParams) and resend step ", barrier_.next_step(), "'s gradients"));
    reload_needed_ = true;
    changed_.SignalAll();
    PublishDoorbellsLocked();
    return;
  }
  if (!pipeline_->early_apply() || barrier_.applied(rank, index)) return;
  // A durable job's states stream from NVMe: once every gradient is in, the
  // step's one pass over the rest is faster than a pass per shard.
  if (pipeline_->durable() && barrier_.complete()) return;
  // Clipping is off, so nothing global decides this shard's update but an
  // overflow, which skips the whole step (loss scaling): step it now, while
  // the trainers are still in backward, and (durable jobs) roll it back if
  // the step is skipped (RunStep). The gradient scale cannot change before
  // the step ends.
  if (pipeline_->durable()) {
    // In a pass with the other shards inspected meanwhile (RunEarlySteps).
    early_ready_.push_back(ShardId{rank, index});
    if (!early_steps_queued_) {
      early_steps_queued_ = true;
      queue_.push_back(WorkItem{WorkItem::kEarlySteps, 0, 0});
    }
    return;
  }
  std::optional<StepHooks> hooks = pipeline_->EarlyStepLocked(mu_, rank, index, slot, /*step_certain=*/false);
  if (!hooks.has_value()) return;
  barrier_.MarkApplied(rank, index);
  const std::vector<ShardId> ids = {ShardId{rank, index}};
  StepEarlyLocked(ShardList(ids), AllSlotsLocked(), *hooks);
}

void Job::RunEarlySteps() {
  absl::MutexLock lock(&mu_);
  // Every gradient is in already: the step (queued) takes them all in its pass.
  if (stopping_ || !worker_error_.ok() || reload_needed_ || barrier_.complete()) {
    early_steps_queued_ = false;
    early_ready_.clear();
    return;
  }
  // early_steps_queued_ stays set while the pass runs: the shards inspected
  // meanwhile join it (NextEarlyShardLocked) instead of queueing another.
  EarlyPass pass;
  pass.slots = AllSlotsLocked();
  // One set of hooks for the pass: each shard's own (taken as it joins).
  // pass outlives the pass's ApplyShards (StepEarlyLocked returns after it).
  auto of = [&pass](const ShardId& id) -> const StepHooks& { return pass.hooks.at({id.rank, id.index}); };
  StepHooks hooks;
  hooks.param_target = [this, &of, &pass](const ShardId& id) {
    const StepHooks& h = of(id);
    return h.param_target ? h.param_target(id) : regions_.ParamSlot(id.rank, pass.slots[id.rank][id.index]);
  };
  hooks.shard_done = [&of](const ShardId& id) {
    const StepHooks& h = of(id);
    return h.shard_done ? h.shard_done(id) : absl::OkStatus();
  };
  ShardSource next = [this, &pass](bool wait) -> std::optional<ShardId> {
    absl::MutexLock lock(&mu_);
    return NextEarlyShardLocked(pass, wait);
  };
  StepEarlyLocked(next, pass.slots, hooks);
  early_steps_queued_ = false;
}

std::optional<ShardId> Job::NextEarlyShardLocked(EarlyPass& pass, bool wait) {
  const absl::Time give_up = absl::Now() + services_.early_pass_wait;
  while (true) {
    if (stopping_ || !worker_error_.ok() || reload_needed_) return std::nullopt;
    while (!early_ready_.empty()) {
      const ShardId id = early_ready_.front();
      early_ready_.pop_front();
      if (TakeEarlyLocked(pass, id)) return id;
    }
    // This pass holds the job's turn: the inspections (and a PrepareStep's
    // stats) queued behind it run here, between its tiles, so the shards
    // they find ready join it.
    if (!queue_.empty() &&
        (queue_.front().kind == WorkItem::kInspect || queue_.front().kind == WorkItem::kPrepare)) {
      const WorkItem item = queue_.front();
      queue_.pop_front();
      mu_.Unlock();
      RunItem(item);
      mu_.Lock();
      continue;
    }
    // Every gradient is in and inspected: the pass goes on with the rest of
    // the step's shards (those whose gradients wait in their slots), so the
    // early shards and the step's are one stream; the step itself is left
    // with spilled gradients and the commit. Not when a gradient overflowed:
    // the step is skipped and the early shards rolled back.
    if (barrier_.complete() && inspect_queued_.empty()) {
      if (!pass.rest.has_value()) {
        pass.rest = barrier_.LocalStats().overflow ? std::vector<ShardId>() : StepShardsLocked();
      }
      // The step cannot be skipped now, unless other daemons' stats decide.
      const bool certain = !settings_.external_step_agreement;
      while (pass.next_rest < pass.rest->size()) {
        const ShardId id = (*pass.rest)[pass.next_rest++];
        if (TakeEarlyLocked(pass, id, certain)) return id;
      }
      return std::nullopt;
    }
    if (!wait || absl::Now() >= give_up) return std::nullopt;
    changed_.WaitWithDeadline(&mu_, give_up);
  }
}

bool Job::TakeEarlyLocked(EarlyPass& pass, const ShardId& id, bool step_certain) {
  if (id.rank >= ranks_.size() || id.index >= ranks_[id.rank].slots.size() ||
      barrier_.applied(id.rank, id.index)) {
    return false;
  }
  std::optional<StepHooks> hooks =
      pipeline_->EarlyStepLocked(mu_, id.rank, id.index, ranks_[id.rank].slots[id.index], step_certain);
  if (!hooks.has_value()) return false;
  barrier_.MarkApplied(id.rank, id.index);
  pass.hooks.insert_or_assign(std::make_pair(id.rank, id.index), std::move(*hooks));
  return true;
}

std::vector<std::vector<ExchangeSlot>> Job::AllSlotsLocked() const {
  std::vector<std::vector<ExchangeSlot>> slots;
  slots.reserve(ranks_.size());
  for (const RankState& r : ranks_) slots.push_back(r.slots);
  return slots;
}

void Job::StepEarlyLocked(const ShardSource& next, const std::vector<std::vector<ExchangeSlot>>& slots,
                          const StepHooks& hooks) {
  const int64_t optimizer_step = static_cast<int64_t>(optimizer_steps_) + 1;
  const float grad_scale = static_cast<float>(1.0 / scaler_.scale());
  const std::vector<OptimizerHyperparams> hp = HyperparamsLocked();
  mu_.Unlock();
  absl::Status status;
  uint64_t stepped = 0;
  StepTimes times;
  {
    const ShardSource counted = [&next, &stepped](bool wait) {
      std::optional<ShardId> id = next(wait);
      stepped += id.has_value() ? 1 : 0;
      return id;
    };
    absl::MutexLock states_lock(&states_mu_);
    status = ApplyShards(counted, slots, optimizer_step, grad_scale, hp, hooks, &times);
    // The pipeline's writes still running are the pass's (its error first).
    absl::Status ended = pipeline_->EndEarlyPass(/*failed=*/!status.ok());
    if (status.ok()) status = ended;
  }
  if (!status.ok() && pipeline_->durable()) RollbackUncommitted();
  mu_.Lock();
  if (!status.ok()) {
    const bool nvme = pipeline_->durable();
    worker_error_ = absl::Status(
        status.code(),
        absl::StrCat("optimizer step of job '", settings_.name, "' failed: ", status.message(),
                     nvme ? absl::StrCat("; nothing of step ", barrier_.next_step(), " was committed. Attach its "
                                         "ranks again (Attach, RegisterTensors, no InitParams) and resend step ",
                                         barrier_.next_step(), "'s gradients")
                          : std::string()));
    reload_needed_ = nvme;
    changed_.SignalAll();
    PublishDoorbellsLocked();
    return;
  }
  if (stepped == 0) return;
  open_step_early_times_.early_stream_s += times.stream_s;
  open_step_early_times_.early_load_wait_s += times.load_wait_s;
  open_step_early_times_.early_params_home_s += times.params_home_s;
  counters_.shards_stepped_early += stepped;
  ++counters_.early_passes;
  open_step_shards_early_ += stepped;
  ++open_step_early_passes_;
}

void Job::RollbackUncommitted() {
  absl::MutexLock commit_lock(&commit_mu_);
  if (!superseded_) services_.nvme->Rollback(id_);
}

absl::Status Job::ApplyShards(const ShardSource& next, const std::vector<std::vector<ExchangeSlot>>& slots,
                              int64_t optimizer_step, float grad_scale, const std::vector<OptimizerHyperparams>& hp,
                              const StepHooks& hooks, StepTimes* times) {
  const auto& shard_done = hooks.shard_done;
  const auto& grad_source = hooks.grad_source;
  const std::byte* shard_grad = nullptr;  // grad_source's answer for the shard being stepped
  std::byte* shard_params = nullptr;      // where the shard's new params go
  const bool sixteen_bit = settings_.param_dtype != DType::kFp32;
  const size_t psize = DTypeSize(settings_.param_dtype);
  const size_t gsize = DTypeSize(settings_.grad_dtype);
  // Adds the time since `from` to `*into` when the caller asked for times.
  using Clock = std::chrono::steady_clock;
  auto add_since = [times](Clock::time_point from, double StepTimes::*into) {
    if (times != nullptr) times->*into += std::chrono::duration<double>(Clock::now() - from).count();
  };
  const Clock::time_point pass_start = Clock::now();
  absl::Status status = states_->UpdateStream(next, [&](const ShardId& id, const StateTile& tile) -> absl::Status {
    const ExchangeSlot& slot = slots[id.rank][id.index];
    const uint64_t tile_end = tile.offset + tile.size;
    if (tile.offset == 0 || shard_params == nullptr) {
      shard_params = hooks.param_target ? hooks.param_target(id) : regions_.ParamSlot(id.rank, slot);
    }
    if (!grad_source) {
      shard_grad = regions_.GradSlot(id.rank, slot);
    } else if (tile.offset == 0) {
      const Clock::time_point t0 = Clock::now();
      absl::StatusOr<const std::byte*> grad = grad_source(id);
      add_since(t0, &StepTimes::grads_back_s);
      if (!grad.ok()) return grad.status();
      shard_grad = *grad;
    }
    // A tile (NVMe streams a shard in tiles) may span several groups' runs:
    // each piece is stepped with its group's hyperparameters. The kernels
    // are elementwise, so the cuts do not change a bit.
    for (const GroupRun& run : slot.group_runs) {
      const uint64_t lo = std::max(run.begin, tile.offset);
      const uint64_t hi = std::min(run.end, tile_end);
      if (lo >= hi) continue;
      const uint64_t rel = lo - tile.offset;
      auto at = [rel](float* p) { return p == nullptr ? nullptr : p + rel; };
      StepSpans spans;
      spans.size = hi - lo;
      spans.params = tile.master + rel;
      spans.exp_avg = at(tile.exp_avg);
      spans.exp_avg_sq = at(tile.exp_avg_sq);
      spans.max_exp_avg_sq = at(tile.max_exp_avg_sq);
      spans.grad = shard_grad + lo * gsize;
      spans.grad_dtype = settings_.grad_dtype;
      std::byte* param_out = shard_params + lo * psize;
      if (sixteen_bit) {
        spans.param_out = param_out;
        spans.param_out_dtype = settings_.param_dtype;
      }
      const Clock::time_point t0 = Clock::now();
      absl::Status stepped = services_.optimizer->Step(hp.at(run.group), optimizer_step, spans, grad_scale);
      add_since(t0, &StepTimes::optimizer_s);
      STRATA_RETURN_IF_ERROR(stepped);
      if (!sixteen_bit) std::memcpy(param_out, spans.params, spans.size * sizeof(float));
    }
    if (shard_done && tile_end == slot.layout.padded_numel) {
      const Clock::time_point t0 = Clock::now();
      absl::Status done = shard_done(id);
      add_since(t0, &StepTimes::params_home_s);
      // A stepped shard may free its gradient slot: the trainer may be waiting for that room.
      absl::MutexLock lock(&mu_);
      PublishGradWindowLocked(id.rank);
      return done;
    }
    return absl::OkStatus();
  });
  if (times != nullptr) {
    add_since(pass_start, &StepTimes::stream_s);
    const UpdateWaits waits = states_->last_update_waits();
    times->load_wait_s += waits.load_s;
    times->save_wait_s += waits.save_s;
  }
  return status;
}

std::vector<ShardId> Job::StepShardsLocked() const {
  std::vector<ShardId> ids;
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    for (const ExchangeSlot& s : ranks_[r].slots) {
      // Shards the early path already stepped (see Inspect) are done.
      if (!barrier_.applied(r, s.layout.index)) ids.push_back(ShardId{r, s.layout.index});
    }
  }
  return ids;
}

void Job::PreloadStates() {
  std::vector<ShardId> ids;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || !worker_error_.ok() || reload_needed_) return;
    ids = StepShardsLocked();
  }
  absl::MutexLock states_lock(&states_mu_);
  if (states_ != nullptr) states_->Preload(ids);
}

void Job::RunStep() {
  const absl::Time start = absl::Now();
  StepTimes times;  // written by this thread only; published under mu_ at the end
  bool overflow = false;
  double squared = 0;
  double scale;
  bool scaler_enabled = false;
  uint64_t step;
  int64_t optimizer_step;
  std::vector<std::vector<ExchangeSlot>> slots;
  std::vector<OptimizerHyperparams> hp;
  {
    absl::MutexLock lock(&mu_);
    // A failed gradient spill (AfterInspectLocked) failed this step already:
    // nothing of it may be applied or committed; the job is reloaded.
    if (reload_needed_) return;
    if (grads_in_start_.has_value()) times.gradients_in_s = absl::ToDoubleSeconds(start - *grads_in_start_);
    times.shards_early = open_step_shards_early_;
    open_step_shards_early_ = 0;
    times.early_passes = open_step_early_passes_;
    open_step_early_passes_ = 0;
    times.early_stream_s = open_step_early_times_.early_stream_s;
    times.early_load_wait_s = open_step_early_times_.early_load_wait_s;
    times.early_params_home_s = open_step_early_times_.early_params_home_s;
    open_step_early_times_ = StepTimes();
    StepStats stats = barrier_.LocalStats();
    if (settings_.external_step_agreement) stats = barrier_.CommittedOpenStep();
    overflow = stats.overflow;
    squared = stats.squared_norm;
    scale = scaler_.scale();
    scaler_enabled = scaler_.enabled();
    step = barrier_.next_step();
    optimizer_step = static_cast<int64_t>(optimizer_steps_) + 1;
    slots = AllSlotsLocked();
    hp = HyperparamsLocked();
  }
  // Norms are of the scaled gradients; unscale before clipping, as DeepSpeed does.
  const double norm = std::sqrt(squared) / scale;
  const bool skip = overflow && scaler_enabled;
  absl::Status status;
  if (!skip) {
    double clip = 1.0;
    if (settings_.gradient_clipping > 0 && std::isfinite(norm)) {
      const double coef = settings_.gradient_clipping / (norm + 1e-6);
      if (coef < 1.0) clip = coef;
    }
    const float grad_scale = static_cast<float>(clip / scale);
    std::vector<ShardId> ids;
    {
      absl::MutexLock lock(&mu_);
      ids = StepShardsLocked();
    }
    absl::MutexLock states_lock(&states_mu_);
    StepHooks hooks = pipeline_->BeginStep(mu_, ids, slots);
    if (hooks.before_shards) {
      const absl::Time t0 = absl::Now();
      status = hooks.before_shards();
      times.params_home_s += absl::ToDoubleSeconds(absl::Now() - t0);
    }
    if (status.ok()) status = ApplyShards(ShardList(ids), slots, optimizer_step, grad_scale, hp, hooks, &times);
    // Before the commit: no spilled copy may become durable.
    const absl::Time end_start = absl::Now();
    pipeline_->EndStep(mu_);
    times.end_s = absl::ToDoubleSeconds(absl::Now() - end_start);
    if (status.ok() && pipeline_->durable()) {
      // The record that goes into the same commit says this step is done.
      std::string record;
      {
        absl::MutexLock lock(&mu_);
        JobRecord r = RecordLocked();
        LossScaler after = scaler_;
        after.Update(overflow);
        r.next_step = step + 1;
        r.optimizer_steps = optimizer_steps_ + 1;
        r.loss_scaler = after.state();
        record = SerializeJobRecord(r);
      }
      const absl::Time commit_start = absl::Now();
      status = CommitWithRecord(record);
      times.commit_s = absl::ToDoubleSeconds(absl::Now() - commit_start);
    }
  } else {
    // Shards stepped early were speculation on this step not overflowing:
    // their states (written to NVMe, not committed) go back to the last
    // commit; their new params never left their gradient slots.
    if (times.shards_early > 0 && pipeline_->durable()) RollbackUncommitted();
    pipeline_->SkipStep(mu_);  // a skipped step's gradients are not needed either
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!status.ok() && pipeline_->durable()) {
    // Nothing of the failed step may become durable (not even by the commit
    // of every owner at shutdown): back to the last committed step.
    RollbackUncommitted();
  }
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    const bool nvme = pipeline_->durable();
    worker_error_ = absl::Status(
        status.code(),
        absl::StrCat("optimizer step ", step, " of job '", settings_.name, "' failed: ", status.message(),
                     nvme ? absl::StrCat("; nothing of step ", step, " was committed (the job's NVMe state is its "
                                         "last commit: ", step == 0 ? std::string("its initial state")
                                         : absl::StrCat("the end of step ", step - 1), "). Attach its ranks "
                                         "again (Attach, RegisterTensors, no InitParams) and resend step ", step,
                                         "'s gradients; if the same shard fails again, the device is failing: "
                                         "restore the job from a checkpoint (LoadCheckpoint)")
                         : std::string()));
    reload_needed_ = nvme;
    grads_in_start_.reset();
    changed_.SignalAll();
    PublishDoorbellsLocked();
    return;
  }
  scaler_.Update(overflow);
  StepOutcome outcome;
  outcome.skipped = skip;
  outcome.grad_norm = norm;
  outcome.next_loss_scale = scaler_.scale();
  if (!skip) ++optimizer_steps_;
  outcome.optimizer_steps = optimizer_steps_;
  if (skip) ++counters_.steps_skipped;
  else ++counters_.steps_applied;
  counters_.last_step_s = seconds;
  counters_.total_step_s += seconds;
  {
    JobCounters spill;
    pipeline_->CountLocked(mu_, spill);
    times.grad_bytes_spilled = spill.grad_bytes_spilled - spilled_at_step_end_;
    times.grad_bytes_read_back = spill.grad_bytes_read_back - read_back_at_step_end_;
    spilled_at_step_end_ = spill.grad_bytes_spilled;
    read_back_at_step_end_ = spill.grad_bytes_read_back;
  }
  if (!skip) counters_.last_step = times;
  grads_in_start_.reset();  // the next step's first gradient starts its phase
  barrier_.Finish(step, outcome);
  PublishStepLocked(step, outcome);
  changed_.SignalAll();
}

}  // namespace strata
