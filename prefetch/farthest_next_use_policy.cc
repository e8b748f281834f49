#include "prefetch/farthest_next_use_policy.h"

namespace strata {

std::optional<size_t> FarthestNextUsePolicy::ChooseVictim(
    const EvictionRequest& request, absl::Span<const EvictionCandidate> candidates) {
  size_t best = 0;
  double best_next = -1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const EvictionCandidate& c = candidates[i];
    const double next = predictor_->NextUse(c.key);
    bool better = false;
    if (i == 0 || next > best_next) {
      better = true;
    } else if (next == best_next) {
      const EvictionCandidate& b = candidates[best];
      better = c.last_use_tick < b.last_use_tick ||
               (c.last_use_tick == b.last_use_tick && !c.dirty && b.dirty);
    }
    if (better) {
      best = i;
      best_next = next;
    }
  }
  if (!request.demand && request.incoming.has_value()) {
    const double incoming_next = predictor_->NextUse(*request.incoming);
    if (!(best_next > incoming_next)) return std::nullopt;  // do no harm
  }
  return best;
}

}  // namespace strata
