// StepBarrier: the step protocol's bookkeeping -- the open step, which
// shards' gradients are in for it (per rank), the per-step hyperparameters
// (BeginStep), the gradient inspections and this daemon's share of them
// (PrepareStep), the committed global values (CommitStep), and the outcomes
// WaitStep reports.
//
// Not thread-safe: the Job holds it under its lock (Job::mu_) and does the
// waiting (WaitStep, PrepareStep) and the scheduling of the step itself.
#ifndef STRATA_DAEMON_STEP_BARRIER_H_
#define STRATA_DAEMON_STEP_BARRIER_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "optimizer_cpu/hyperparams.h"
#include "core/group_hyperparams.h"

namespace strata {

// A daemon's share of a step's gradient checks (PrepareStep), or the values
// agreed across daemons (CommitStep).
struct StepStats {
  bool overflow = false;
  double squared_norm = 0;  // of the loss-scaled gradients
  bool operator==(const StepStats&) const = default;
};

struct StepOutcome {
  bool skipped = false;
  double next_loss_scale = 1.0;
  double grad_norm = 0.0;
  uint64_t optimizer_steps = 0;
};

class StepBarrier {
 public:
  // Param groups per job; torch models rarely have more than a handful.
  static constexpr uint32_t kMaxGroups = 4096;

  // Rank `rank` (of `world`) exchanges `shards` shards (when its window is
  // built); ranks never added (served by another daemon) have none.
  void AddRank(uint32_t rank, uint32_t world, size_t shards);
  // A rank whose build failed has none again.
  void DropRank(uint32_t rank);

  uint64_t next_step() const { return next_step_; }
  // The open step's optimizer step is queued or running: no gradient is taken.
  bool step_queued() const { return step_queued_; }
  uint64_t grads_missing() const { return grads_missing_; }
  // Every local shard's gradient of the open step is in.
  bool complete() const { return grads_missing_ == 0; }

  // A gradient signal: true when it is taken for the open step, false for a
  // duplicate that changes nothing (a re-sent signal of a step whose
  // gradients are all in or that is applied, or a shard stepped early);
  // FailedPrecondition for a step already applied or not open.
  absl::StatusOr<bool> Accept(uint32_t rank, uint32_t index, uint64_t step);
  // The open step's optimizer step is queued (no CommitStep to wait for).
  void QueueStep() { step_queued_ = true; }

  // BeginStep (see Job::BeginStep); `base` is the job's optimizer settings.
  absl::Status Begin(uint64_t step, const std::vector<GroupHyperparams>& groups, uint32_t num_groups,
                     const OptimizerHyperparams& base);
  // The hyperparameters in force, one per group.
  std::vector<OptimizerHyperparams> Hyperparams(uint32_t num_groups, const OptimizerHyperparams& base) const;
  const std::vector<GroupHyperparams>& group_hyperparams() const { return group_hp_; }

  // A shard's gradient check (overflow and squared norm) for the open step.
  void Inspected(uint32_t rank, uint32_t index, bool overflow, double squared_norm);
  // Sums the inspections: ranks pairwise in rank order, shards in order.
  StepStats LocalStats() const;

  // Early apply (ZeRO-Offload without loss scaling or clipping): the shard
  // was stepped before the rest of the step.
  bool applied(uint32_t rank, uint32_t index) const { return applied_[rank][index]; }
  void MarkApplied(uint32_t rank, uint32_t index) { applied_[rank][index] = true; }
  bool AnyApplied() const;

  // PrepareStep's answer for `step`, once the local gradients are in.
  const StepStats* Prepared(uint64_t step) const;
  // Records LocalStats for the open step when it is complete and not queued.
  bool PrepareOpenStep();
  // CommitStep: checks `global` against this daemon's share and queues the
  // step; OkStatus without queueing for a repeat of an equal commit (*queued
  // says which).
  absl::Status Commit(uint64_t step, const StepStats& global, bool* queued);
  // The committed values of the open step (external_step_agreement).
  const StepStats& CommittedOpenStep() const { return committed_.at(next_step_); }

  // The step is done: its outcome is kept (a bounded history), the next one opens.
  void Finish(uint64_t step, const StepOutcome& outcome);
  const StepOutcome* Outcome(uint64_t step) const;

  // A job restored from a record or checkpoint resumes at `next_step`.
  void Restore(uint64_t next_step, std::vector<GroupHyperparams> group_hp);

 private:
  uint64_t next_step_ = 0;  // the step GradReady fills
  uint64_t grads_missing_ = 0;
  bool step_queued_ = false;
  bool step_has_grads_ = false;  // a GradReady came for next_step_
  std::vector<std::vector<bool>> ready_;    // per rank and shard, this step
  std::vector<std::vector<bool>> applied_;  // stepped early, this step
  // Overflow and squared norm per (rank, index) of the step being filled.
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, std::pair<bool, double>> inspections_;
  absl::flat_hash_map<uint64_t, StepOutcome> outcomes_;
  // Per-group hyperparameters in force (BeginStep's values without the
  // job-wide fields); empty = the job's optimizer settings for every group.
  std::vector<GroupHyperparams> group_hp_;
  // The step group_hp_ was set for, when BeginStep set it.
  std::optional<uint64_t> group_hp_step_;
  // external_step_agreement: this daemon's stats and the committed global
  // ones, per step (a bounded history, as outcomes_).
  absl::flat_hash_map<uint64_t, StepStats> prepared_;
  absl::flat_hash_map<uint64_t, StepStats> committed_;
};

}  // namespace strata

#endif  // STRATA_DAEMON_STEP_BARRIER_H_
