#include "daemon/offload_pipeline.h"

#include <algorithm>

#include "core/checked_math.h"
#include "core/status_macros.h"
#include "daemon/host_shard_state_store.h"

namespace strata {

absl::StatusOr<std::unique_ptr<ShardStateStore>> OffloadPipeline::MakeStates(const StateLayout& layout,
                                                                             uint64_t /*tile_bytes*/) {
  return std::make_unique<HostShardStateStore>(layout);
}

absl::StatusOr<uint64_t> OffloadPipeline::RankPinnedBytes(uint32_t /*rank*/, const ExchangeLayout& layout,
                                                          const StateLayout& states) const {
  constexpr uint64_t kPage = 4096;
  const uint64_t streams = 1 + states.exp_avg + states.exp_avg_sq + states.max_exp_avg_sq;
  // HostShardStateStore keeps each shard's states in pinned memory, beside
  // the rank's (populated) region.
  uint64_t state_bytes = 0;
  for (const ExchangeSlot& slot : layout.slots) {
    STRATA_ASSIGN_OR_RETURN(const uint64_t sraw, CheckedMul(slot.layout.padded_numel, streams * 4, "state bytes"));
    STRATA_ASSIGN_OR_RETURN(const uint64_t spage, CheckedRoundUp(std::max(sraw, kPage), kPage, "state bytes"));
    STRATA_ASSIGN_OR_RETURN(state_bytes, CheckedAdd(state_bytes, spage, "state bytes"));
  }
  return CheckedAdd(layout.region_bytes, state_bytes, "pinned bytes");
}

}  // namespace strata
