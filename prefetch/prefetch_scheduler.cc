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
    if (in_flight_.size() >= options_.max_in_flight) break;
    absl::StatusOr<TransferHandle> transfer =
        store_->Promote(next.key, options_.tier,
                        {.prefetch = true,
                         .urgent = next.distance < static_cast<double>(options_.urgent_distance)});
    if (!transfer.ok()) {
      ++stats_.refused;
      break;
    }
    ++stats_.issued;
    if (!(*transfer)->done()) in_flight_.push_back(*transfer);
    issued.push_back({next.key, *transfer});
  }
  return issued;
}

}  // namespace strata
