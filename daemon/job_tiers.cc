// Job: where a param shard is served from (AcquireIn), and parking a job's
// shards in a lower tier (Park / Resume).
//
// The params of a ZeRO-Infinity job live in the daemon's tiered store (home on
// NVMe, cached in the rank's window and, for a job with a device budget, in
// the device arena); an Offload job's params always sit in its window.
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "daemon/job.h"

namespace strata {

absl::StatusOr<std::vector<ShardPlace>> Job::AcquireIn(uint32_t rank, const std::vector<uint32_t>& indices,
                                                       TierKind tier, absl::Time deadline) {
  if (tier != TierKind::kPinnedHost) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Acquire into the ", TierKindName(tier), " tier: this daemon serves params from the pinned window only"));
  }
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

absl::StatusOr<ParkReport> Job::Park(TierKind to) {
  return absl::UnimplementedError(absl::StrCat("Park to ", TierKindName(to), " is not built yet"));
}

absl::StatusOr<ParkReport> Job::Resume() { return absl::UnimplementedError("Resume is not built yet"); }

}  // namespace strata
