// Job: where a param shard is served from (AcquireIn), and parking a job's
// shards in a lower tier (Park / Resume).
//
// The params of a ZeRO-Infinity job live in the daemon's tiered store
// (daemon/param_store.h: home on NVMe, cached in the rank's window and, for a
// job with a device budget, in the device arena); an Offload job's params
// always sit in its window.
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "daemon/job.h"

namespace strata {

absl::StatusOr<std::vector<ShardPlace>> Job::AcquireIn(uint32_t rank, const std::vector<uint32_t>& indices,
                                                       TierKind tier, absl::Time deadline) {
  if (tier == TierKind::kPinnedHost) {
    STRATA_RETURN_IF_ERROR(Acquire(rank, indices, deadline));
    absl::MutexLock lock(&mu_);
    std::vector<ShardPlace> places;
    places.reserve(indices.size());
    for (uint32_t index : indices) {
      const ExchangeSlot& slot = ranks_[rank].slots[index];
      places.push_back(ShardPlace{index, TierKind::kPinnedHost, slot.param_offset, ParamSlotBytes(slot)});
    }
    return places;
  }
  if (tier != TierKind::kDevice) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Acquire into the ", TierKindName(tier), " tier: params are served from the pinned window or the device"));
  }
  std::vector<uint64_t> bytes;
  {
    absl::MutexLock lock(&mu_);
    if (settings_.mode != JobMode::kInfinity) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Acquire into the device tier: job '", settings_.name, "' is a ZeRO-Offload job, whose params stay in its "
          "window; the device tier serves ZeRO-Infinity jobs (mode infinity)"));
    }
    if (!registered_) return absl::FailedPreconditionError("Acquire before RegisterTensors");
    if (rank >= ranks_.size()) {
      return absl::OutOfRangeError(absl::StrCat("rank ", rank, " is out of range"));
    }
    for (uint32_t index : indices) {
      if (index >= ranks_[rank].slots.size()) {
        return absl::OutOfRangeError(absl::StrCat("shard index ", index, " is out of range: rank ", rank,
                                                  " has ", ranks_[rank].slots.size(), " shards"));
      }
      bytes.push_back(ParamSlotBytes(ranks_[rank].slots[index]));
    }
    if (!ranks_[rank].initialized) return absl::FailedPreconditionError("Acquire before InitParams");
  }
  ParamCache* params = pipeline_->params();
  if (params == nullptr || !params->has_device_tier()) {
    return absl::FailedPreconditionError(
        "Acquire into the device tier: this daemon has no device tier (start stratad with --device cuda or "
        "--device emulated)");
  }
  if (settings_.device_budget_bytes == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Acquire into the device tier: job '", settings_.name,
        "' has no device budget (create it with device_budget_bytes > 0)"));
  }
  STRATA_RETURN_IF_ERROR(params->SetDeviceBudget(settings_.device_budget_bytes));
  STRATA_ASSIGN_OR_RETURN(std::vector<uint64_t> offsets, params->AcquireDevice(rank, indices, deadline));
  std::vector<ShardPlace> places;
  places.reserve(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    places.push_back(ShardPlace{indices[i], TierKind::kDevice, offsets[i], bytes[i]});
  }
  return places;
}

namespace {

ParkReport ToReport(const ParamMove& move) {
  ParkReport report;
  report.tier = move.top;
  report.shards = move.shards;
  report.bytes_moved = move.bytes_moved;
  report.seconds = move.seconds;
  return report;
}

}  // namespace

absl::StatusOr<ParkReport> Job::Park(TierKind to) {
  ParamCache* params = pipeline_->params();
  if (settings_.mode != JobMode::kInfinity || params == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Park: job '", settings_.name, "' is ",
        settings_.mode != JobMode::kInfinity ? "a ZeRO-Offload job, whose params and states live in pinned "
                                                      "memory for its whole life; parking applies to ZeRO-Infinity "
                                                      "jobs"
                                                    : "not registered yet"));
  }
  // Not while an optimizer step rewrites the params.
  absl::MutexLock states_lock(&states_mu_);
  STRATA_ASSIGN_OR_RETURN(ParamMove move, params->Park(to));
  return ToReport(move);
}

absl::StatusOr<ParkReport> Job::Resume() {
  ParamCache* params = pipeline_->params();
  if (settings_.mode != JobMode::kInfinity || params == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Resume: job '", settings_.name, "' ",
        settings_.mode != JobMode::kInfinity ? "is a ZeRO-Offload job, which is never parked"
                                                    : "is not registered yet"));
  }
  absl::MutexLock states_lock(&states_mu_);
  STRATA_ASSIGN_OR_RETURN(ParamMove move, params->Resume());
  return ToReport(move);
}

}  // namespace strata
