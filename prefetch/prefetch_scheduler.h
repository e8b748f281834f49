// PrefetchScheduler: turns predictions into promotions. Each Pump() walks the
// predicted future from the current position and promotes, nearest first,
// every shard not yet in the target tier, within a lookahead window bounded
// in shards and in bytes (DeepSpeed's stage3_max_live_parameters and
// stage3_prefetch_bucket_size play these roles) and a cap on promotions in
// flight. Promotions go through the store, so they run on its executor and
// I/O engine and evict by the store's policy; with FarthestNextUsePolicy a
// promotion that would evict something needed sooner is refused, and the
// pump stops there (anything farther would be refused too). Shards needed
// within `urgent_distance` accesses may be promoted as urgent (the policy
// then evicts even a copy MIN would keep) only when that is predicted to be
// harmless (`adaptive_urgency`). Each pump also writes back early the dirty
// copies MIN will drop to make room for the window.
//
// Thread-compatible: one thread pumps a scheduler (the job's access path).
// It never holds a lock while calling the store.
#ifndef STRATA_PREFETCH_PREFETCH_SCHEDULER_H_
#define STRATA_PREFETCH_PREFETCH_SCHEDULER_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "prefetch/access_predictor.h"
#include "prefetch/prediction_trust.h"
#include "tiers/tiered_store.h"

namespace strata {

struct PrefetchSchedulerOptions {
  TierKind tier = TierKind::kDevice;  // where prefetched shards go
  size_t lookahead_count = 8;
  uint64_t lookahead_bytes = 1ull << 30;
  size_t max_in_flight = 8;
  // Shards predicted within this many accesses may be prefetched as urgent:
  // the policy may then evict a copy MIN would keep now, instead of waiting
  // for room that harms nothing (0 disables). The default is the whole
  // window: with adaptive_urgency each urgent promotion is checked to cost
  // no fetch MIN would not make, so a distance cap would only withhold
  // harmless urgency, and urgency far ahead is what lets a prefetch start
  // early enough for a busy link (the fixed rule used 2).
  size_t urgent_distance = std::numeric_limits<size_t>::max();
  // Adaptive urgency: use it only when it is predicted to cost no fetch MIN
  // would not make. The urgent path evicts the copy used farthest away (V)
  // now, where MIN would make room later by dropping another copy. The
  // scheduler replays MIN over the predicted sequence (the predictor's
  // Sequence) from the tier's current copies up to V's next use: if MIN
  // drops V before then anyway, evicting it now is free and the prefetch
  // goes urgent; otherwise it waits, as MIN would, for room that harms
  // nothing. It adapts to the trace and to the tier's size: the same shard
  // is harmless to drop in a small tier and costly in a large one.
  bool adaptive_urgency = true;
  // Early write-back: per Pump, at most this many of the copies Belady will
  // evict to make room for the window's upcoming promotions (the cached
  // copies used farthest away, one per shard the window still has to bring
  // in) are written home if dirty, so their eviction becomes a clean drop
  // instead of a write-back on the critical path (0 disables).
  size_t write_backs_per_pump = 1;
  // The job's measured prediction accuracy (borrowed, optional): while it
  // says the prediction loses to recency, Pump issues nothing (no
  // speculative promotions, no write-backs ranked by the prediction).
  const PredictionTrust* trust = nullptr;
};

struct IssuedPrefetch {
  ShardKey key;
  TransferHandle transfer;
  bool write_back = false;  // an early write-back, not a promotion
};

struct PrefetchSchedulerStats {
  uint64_t pumps = 0;
  uint64_t issued = 0;
  uint64_t refused = 0;  // a promotion the store or the policy turned down
  uint64_t write_backs = 0;
  uint64_t urgent = 0;            // promotions issued as urgent
  uint64_t urgency_withheld = 0;  // pumps where urgency would have cost a fetch
  uint64_t untrusted_pumps = 0;   // pumps skipped: the prediction was not trusted
};

class PrefetchScheduler {
 public:
  // `store` and `predictor` are borrowed and must outlive the scheduler.
  PrefetchScheduler(TieredStore* store, const AccessPredictor* predictor,
                    const PrefetchSchedulerOptions& options);

  // Issues the promotions the window calls for; returns them in issue order.
  std::vector<IssuedPrefetch> Pump();

  const PrefetchSchedulerStats& stats() const { return stats_; }

 private:
  // Replays MIN from the tier's current copies over the predicted sequence:
  // whether it drops `victim` (next use predicted at `victim_next`) before
  // that use, so that evicting it now costs no fetch MIN would not make.
  bool MinDropsBeforeNextUse(const ShardKey& victim, double victim_next,
                             absl::Span<const TieredStore::CachedCopy> cached) const;
  // Whether the urgent path's victim among `cached` would be dropped by MIN
  // before its next use anyway (see adaptive_urgency).
  bool UrgencyIsHarmless(absl::Span<const TieredStore::CachedCopy> cached);

  TieredStore* const store_;
  const AccessPredictor* const predictor_;
  const PrefetchSchedulerOptions options_;
  std::vector<TransferHandle> in_flight_;
  absl::flat_hash_map<ShardKey, uint64_t> sizes_;
  PrefetchSchedulerStats stats_;
};

}  // namespace strata

#endif  // STRATA_PREFETCH_PREFETCH_SCHEDULER_H_
