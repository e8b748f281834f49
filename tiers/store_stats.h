// Counters the TieredStore keeps for users and benchmarks.
#ifndef STRATA_TIERS_STORE_STATS_H_
#define STRATA_TIERS_STORE_STATS_H_

#include <array>
#include <cstdint>

#include "absl/time/time.h"
#include "core/tier_kind.h"

namespace strata {

struct TierCounters {
  uint64_t acquire_hits = 0;    // Acquire found a current copy in this tier
  uint64_t acquire_misses = 0;  // Acquire had to wait for (or start) a promotion
  uint64_t promotions = 0;      // copies brought into this tier (demand + prefetch)
  uint64_t evictions = 0;       // cached copies dropped to make room
  uint64_t write_backs = 0;     // dirty copies written to their home first
  uint64_t bytes_in = 0;        // bytes copied into this tier
  uint64_t bytes_out = 0;       // bytes copied out of this tier
  // Prefetches (Promote without `demand`) into this tier, and what became of
  // them: acquired here before being dropped, or dropped unacquired. The
  // store-wide StoreStats fields are the sums over the tiers.
  uint64_t prefetches_issued = 0;
  uint64_t prefetches_used = 0;
  uint64_t prefetches_wasted = 0;
};

struct StoreStats {
  std::array<TierCounters, kNumTiers> tiers;
  // Bytes moved towards faster tiers (promotions) and towards slower ones
  // (write-backs and demotions).
  uint64_t bytes_up = 0;
  uint64_t bytes_down = 0;
  // Time Acquire calls spent waiting for data, summed over calls.
  absl::Duration stall_time = absl::ZeroDuration();
  uint64_t stalled_acquires = 0;
  uint64_t prefetches_issued = 0;
  uint64_t prefetches_used = 0;    // acquired before being dropped
  uint64_t prefetches_wasted = 0;  // dropped (evicted or demoted) without an acquire
  uint64_t leases_expired = 0;

  const TierCounters& tier(TierKind kind) const { return tiers[TierIndex(kind)]; }
};

}  // namespace strata

#endif  // STRATA_TIERS_STORE_STATS_H_
