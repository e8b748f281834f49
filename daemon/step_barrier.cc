#include "daemon/step_barrier.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

// Pairwise, so that daemons holding contiguous halves of the ranks, whose
// shares the trainers add, get the same bits as one daemon holding all.
double PairwiseSum(const double* v, size_t n) {
  if (n == 0) return 0;
  if (n == 1) return v[0];
  const size_t half = (n + 1) / 2;
  return PairwiseSum(v, half) + PairwiseSum(v + half, n - half);
}

// Keeps a bounded history of per-step values.
template <typename Map>
void Forget(Map& map, uint64_t step) {
  map.erase(step >= 64 ? step - 64 : UINT64_MAX);
}

}  // namespace

void StepBarrier::AddRank(uint32_t rank, uint32_t world, size_t shards) {
  if (ready_.size() < world) ready_.resize(world);
  if (applied_.size() < world) applied_.resize(world);
  ready_[rank].assign(shards, false);
  applied_[rank].assign(shards, false);
}

void StepBarrier::DropRank(uint32_t rank) {
  if (rank < ready_.size()) ready_[rank].clear();
  if (rank < applied_.size()) applied_[rank].clear();
}

absl::StatusOr<bool> StepBarrier::Accept(uint32_t rank, uint32_t index, uint64_t step) {
  // A re-sent signal of a step that has every gradient -- the step just
  // applied, or the one whose optimizer step is running -- is a duplicate:
  // the shard was counted, so it changes nothing and WaitStep reports the
  // step's outcome. Ranks that re-attach after a crash re-send the step they
  // were in, and a doorbell entry can be drained after the other ranks'
  // signals completed the step; neither is an error.
  if (step + 1 == next_step_ || (step == next_step_ && step_queued_ && ready_[rank][index])) return false;
  if (step < next_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " was already applied; the job is at step ", next_step_));
  }
  if (step > next_step_ || step_queued_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step, " is not open for gradients; the job is at step ", next_step_,
        step_queued_ ? " and its optimizer step is running" : ""));
  }
  if (applied_[rank][index]) {
    // Already stepped with the first copy (early path); a restarted rank
    // re-sending the same gradient changes nothing.
    return false;
  }
  ready_[rank][index] = true;
  step_has_grads_ = true;
  grads_missing_ = 0;
  for (const std::vector<bool>& rs : ready_) {
    for (bool ready : rs) grads_missing_ += ready ? 0 : 1;
  }
  return true;
}

std::vector<OptimizerHyperparams> StepBarrier::Hyperparams(uint32_t num_groups,
                                                           const OptimizerHyperparams& base) const {
  std::vector<OptimizerHyperparams> out(num_groups, base);
  for (size_t g = 0; g < group_hp_.size() && g < out.size(); ++g) {
    const GroupHyperparams& in = group_hp_[g];
    out[g].lr = in.lr;
    out[g].beta1 = in.beta1;
    out[g].beta2 = in.beta2;
    out[g].eps = in.eps;
    out[g].weight_decay = in.weight_decay;
    out[g].lr_decay = in.lr_decay;
  }
  return out;
}

absl::Status StepBarrier::Begin(uint64_t step, const std::vector<GroupHyperparams>& groups,
                                uint32_t num_groups, const OptimizerHyperparams& base) {
  // The step just applied, begun again (a re-attached rank repeating it):
  // the same values are a duplicate, checked below like another rank's copy.
  if (step < next_step_ && !(step + 1 == next_step_ && group_hp_step_ == step)) {
    return absl::FailedPreconditionError(
        absl::StrCat("BeginStep for step ", step, ", which was already applied; the job is at step ", next_step_));
  }
  if (group_hp_step_ == step) {
    // Another rank's copy: it must say the same.
    if (groups.size() != group_hp_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("BeginStep for step ", step, " sends ", groups.size(),
                                                     " groups but the step was begun with ", group_hp_.size()));
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      const GroupHyperparams& a = groups[g];
      const GroupHyperparams& b = group_hp_[g];
      const std::pair<const char*, std::pair<double, double>> fields[] = {
          {"lr", {a.lr, b.lr}},
          {"beta1", {a.beta1, b.beta1}},
          {"beta2", {a.beta2, b.beta2}},
          {"eps", {a.eps, b.eps}},
          {"weight_decay", {a.weight_decay, b.weight_decay}},
          {"lr_decay", {a.lr_decay, b.lr_decay}}};
      for (const auto& [field, values] : fields) {
        if (values.first != values.second) {
          return absl::InvalidArgumentError(absl::StrCat(
              "BeginStep for step ", step, " sets group ", g, " ", field, " = ", values.first,
              " but the step was begun with ", values.second, " (every rank must send the same values)"));
        }
      }
    }
    return absl::OkStatus();
  }
  if (step > next_step_) {
    return absl::FailedPreconditionError(absl::StrCat("BeginStep for step ", step,
                                                      " is too early; the job is at step ", next_step_));
  }
  if (step_has_grads_ || step_queued_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BeginStep for step ", step, " came after the step's first GradReady; send it before any gradient"));
  }
  if (groups.size() < num_groups) {
    return absl::InvalidArgumentError(absl::StrCat("BeginStep gives ", groups.size(),
                                                   " groups but the registered tensors use group indices up to ",
                                                   num_groups - 1, " (", num_groups, " groups needed)"));
  }
  if (groups.size() > kMaxGroups) {
    return absl::InvalidArgumentError(absl::StrCat("BeginStep gives ", groups.size(), " groups; at most ",
                                                   kMaxGroups, " are allowed"));
  }
  std::vector<GroupHyperparams> previous = std::move(group_hp_);
  group_hp_ = groups;
  const std::vector<OptimizerHyperparams> hp = Hyperparams(num_groups, base);
  for (size_t g = 0; g < hp.size(); ++g) {
    if (absl::Status v = ValidateOptimizerHyperparams(hp[g]); !v.ok()) {
      group_hp_ = std::move(previous);
      return absl::InvalidArgumentError(absl::StrCat("BeginStep group ", g, ": ", v.message()));
    }
  }
  group_hp_step_ = step;
  return absl::OkStatus();
}

void StepBarrier::Inspected(uint32_t rank, uint32_t index, bool overflow, double squared_norm) {
  inspections_[{rank, index}] = {overflow, squared_norm};
}

StepStats StepBarrier::LocalStats() const {
  StepStats stats;
  std::vector<double> per_rank;
  for (uint32_t r = 0; r < ready_.size(); ++r) {
    if (ready_[r].empty()) continue;
    double sum = 0;
    for (uint32_t i = 0; i < ready_[r].size(); ++i) {
      auto it = inspections_.find({r, i});
      if (it == inspections_.end()) continue;
      stats.overflow = stats.overflow || it->second.first;
      sum += it->second.second;
    }
    per_rank.push_back(sum);
  }
  stats.squared_norm = PairwiseSum(per_rank.data(), per_rank.size());
  return stats;
}

bool StepBarrier::AnyApplied() const {
  for (const std::vector<bool>& rank : applied_) {
    for (bool applied : rank) {
      if (applied) return true;
    }
  }
  return false;
}

const StepStats* StepBarrier::Prepared(uint64_t step) const {
  auto it = prepared_.find(step);
  return it == prepared_.end() ? nullptr : &it->second;
}

bool StepBarrier::PrepareOpenStep() {
  if (grads_missing_ != 0 || step_queued_) return false;
  prepared_[next_step_] = LocalStats();
  Forget(prepared_, next_step_);
  return true;
}

absl::Status StepBarrier::Commit(uint64_t step, const StepStats& global, bool* queued) {
  *queued = false;
  if (auto it = committed_.find(step); it != committed_.end()) {
    if (it->second == global) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "CommitStep for step ", step, " says overflow=", global.overflow, " squared_norm=", global.squared_norm,
        " but the step was committed with overflow=", it->second.overflow,
        " squared_norm=", it->second.squared_norm, " (every rank must commit the all-reduced values)"));
  }
  if (step != next_step_) {
    return absl::FailedPreconditionError(absl::StrCat("CommitStep for step ", step, "; the job is at step ",
                                                      next_step_));
  }
  auto it = prepared_.find(step);
  if (it == prepared_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CommitStep for step ", step, " before every local rank's gradients are in (call PrepareStep first)"));
  }
  const StepStats& local = it->second;
  if (std::isnan(global.squared_norm) ? !global.overflow : global.squared_norm < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CommitStep: squared_norm ", global.squared_norm,
                                                   " is not a sum of squares"));
  }
  if (local.overflow && !global.overflow) {
    return absl::InvalidArgumentError(
        "CommitStep: this daemon's gradients overflowed but the committed overflow flag is false "
        "(all-reduce the flags with MAX/OR)");
  }
  if (!global.overflow && global.squared_norm < local.squared_norm) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CommitStep: the global squared_norm ", global.squared_norm, " is below this daemon's own ",
        local.squared_norm, " (all-reduce PrepareStep's squared_norm with SUM)"));
  }
  committed_[step] = global;
  Forget(committed_, step);
  step_queued_ = true;
  *queued = true;
  return absl::OkStatus();
}

void StepBarrier::Finish(uint64_t step, const StepOutcome& outcome) {
  outcomes_[step] = outcome;
  Forget(outcomes_, step);
  inspections_.clear();
  grads_missing_ = 0;
  for (std::vector<bool>& r : ready_) {
    std::fill(r.begin(), r.end(), false);
    grads_missing_ += r.size();
  }
  for (std::vector<bool>& r : applied_) std::fill(r.begin(), r.end(), false);
  step_queued_ = false;
  step_has_grads_ = false;
  next_step_ = step + 1;
}

const StepOutcome* StepBarrier::Outcome(uint64_t step) const {
  auto it = outcomes_.find(step);
  return it == outcomes_.end() ? nullptr : &it->second;
}

void StepBarrier::Restore(uint64_t next_step, std::vector<GroupHyperparams> group_hp) {
  next_step_ = next_step;
  group_hp_ = std::move(group_hp);
  group_hp_step_.reset();
}

}  // namespace strata
