#include "prefetch/farthest_next_use_policy.h"

namespace strata {

std::optional<size_t> FarthestNextUsePolicy::ChooseVictim(
    const EvictionRequest& request, absl::Span<const EvictionCandidate> candidates) {
  if (trust_ != nullptr && !trust_->Trusted()) {
    // The prediction is measured to lose to recency on this job: demand
    // paging with LRU, no speculative evictions. LRU still spares the
    // copies predicted within a tier's worth of accesses (an expert's
    // gradient once the expert was routed to) while any other is left:
    // those are the predictions that stay right when the rest is noise.
    if (!request.demand && request.incoming.has_value()) return std::nullopt;
    const double horizon = static_cast<double>(candidates.size());
    std::optional<size_t> found;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const EvictionCandidate& c = candidates[i];
      if (c.pinned || predictor_->NextUse(c.key) < horizon) continue;
      if (!found.has_value()) {
        found = i;
        continue;
      }
      const EvictionCandidate& b = candidates[*found];
      if (c.last_use_tick < b.last_use_tick ||
          (c.last_use_tick == b.last_use_tick && !c.dirty && b.dirty)) {
        found = i;
      }
    }
    if (found.has_value()) return found;
    return recency_.ChooseVictim(request, candidates);
  }
  // Ties on the predicted use go to the least recently used, then to clean
  // copies (no write-back).
  auto better = [&](size_t i, double next, std::optional<size_t> best, double best_next) {
    if (!best.has_value() || next > best_next) return true;
    if (next < best_next) return false;
    const EvictionCandidate& c = candidates[i];
    const EvictionCandidate& b = candidates[*best];
    return c.last_use_tick < b.last_use_tick ||
           (c.last_use_tick == b.last_use_tick && !c.dirty && b.dirty);
  };
  if (request.demand || !request.incoming.has_value()) {
    // Belady now: the unpinned copy used farthest in the future.
    std::optional<size_t> best;
    double best_next = -1;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (candidates[i].pinned) continue;
      const double next = predictor_->NextUse(candidates[i].key);
      if (better(i, next, best, best_next)) {
        best = i;
        best_next = next;
      }
    }
    return best;
  }
  // A prefetch makes room now for a shard needed at distance d. Belady would
  // make that room at d, dropping the copy whose use *after d* is farthest
  // (copies used before d have moved on to their following use by then). If
  // that copy is still needed before d, or is in use, dropping anything now
  // would cost a fetch MIN does not make: refuse, and let the scheduler try
  // again later. This also never evicts a copy needed no later than the
  // incoming shard ("do no harm").
  const double d = predictor_->NextUse(*request.incoming);
  if (d == kNeverUsed) return std::nullopt;
  std::optional<size_t> best;
  double best_next = -1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double next = predictor_->NextUseFrom(candidates[i].key, d);
    if (better(i, next, best, best_next)) {
      best = i;
      best_next = next;
    }
  }
  if (best.has_value() && !candidates[*best].pinned &&
      predictor_->NextUse(candidates[*best].key) > d) {
    return best;
  }
  if (!request.urgent) return std::nullopt;
  // Urgent: the farthest-used unpinned copy, if it is needed after the
  // incoming shard (never harm), even though MIN would keep it.
  best.reset();
  best_next = -1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].pinned) continue;
    const double next = predictor_->NextUse(candidates[i].key);
    if (better(i, next, best, best_next)) {
      best = i;
      best_next = next;
    }
  }
  if (!best.has_value() || !(best_next > d)) return std::nullopt;
  return best;
}

}  // namespace strata
