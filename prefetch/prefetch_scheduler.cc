#include "prefetch/prefetch_scheduler.h"

#include <algorithm>

namespace strata {

PrefetchScheduler::PrefetchScheduler(TieredStore* store, const AccessPredictor* predictor,
                                     const PrefetchSchedulerOptions& options)
    : store_(store), predictor_(predictor), options_(options) {}

std::vector<IssuedPrefetch> PrefetchScheduler::Pump() {
  ++stats_.pumps;
  std::vector<IssuedPrefetch> issued;
  in_flight_.erase(std::remove_if(in_flight_.begin(), in_flight_.end(),
                                  [](const TransferHandle& t) { return t->done(); }),
                   in_flight_.end());
  uint64_t window_bytes = 0;
  size_t still_to_fetch = 0;  // window shards neither resident nor arriving
  bool refused = false;
  for (const PredictedAccess& next : predictor_->Upcoming(options_.lookahead_count)) {
    auto size_it = sizes_.find(next.key);
    if (size_it == sizes_.end()) {
      absl::StatusOr<ShardInfo> info = store_->Describe(next.key);
      if (!info.ok()) continue;  // not (or no longer) in the store
      size_it = sizes_.emplace(next.key, info->size_bytes).first;
    }
    if (window_bytes + size_it->second > options_.lookahead_bytes) break;
    window_bytes += size_it->second;
    if (store_->IsResident(next.key, options_.tier) || store_->IsInFlight(next.key, options_.tier)) {
      continue;
    }
    ++still_to_fetch;
    // After a refusal everything farther would be refused too; keep
    // counting what the window still needs, for the write-backs below.
    if (refused || in_flight_.size() >= options_.max_in_flight) continue;
    absl::StatusOr<TransferHandle> transfer =
        store_->Promote(next.key, options_.tier,
                        {.prefetch = true,
                         .urgent = next.distance < static_cast<double>(options_.urgent_distance)});
    if (!transfer.ok()) {
      ++stats_.refused;
      refused = true;
      continue;
    }
    --still_to_fetch;
    ++stats_.issued;
    if (!(*transfer)->done()) in_flight_.push_back(*transfer);
    issued.push_back({next.key, *transfer});
  }
  if (options_.write_backs_per_pump == 0 || still_to_fetch == 0) return issued;
  // Belady's next victims: the cached copies used farthest away, one per
  // shard still to fetch. Clean the dirty ones among them.
  std::vector<std::pair<double, TieredStore::CachedCopy>> cached;
  for (const TieredStore::CachedCopy& c : store_->CachedCopies(options_.tier)) {
    cached.emplace_back(predictor_->NextUse(c.key), c);
  }
  std::sort(cached.begin(), cached.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second.key < b.second.key;
  });
  size_t written = 0;
  for (size_t i = 0; i < cached.size() && i < still_to_fetch; ++i) {
    const TieredStore::CachedCopy& c = cached[i].second;
    if (!c.dirty || c.pinned || written >= options_.write_backs_per_pump) continue;
    absl::StatusOr<TransferHandle> transfer = store_->WriteBack(c.key);
    if (!transfer.ok()) continue;
    ++written;
    ++stats_.write_backs;
    issued.push_back({c.key, *transfer, true});
  }
  return issued;
}

}  // namespace strata
