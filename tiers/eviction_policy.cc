#include "tiers/eviction_policy.h"

namespace strata {

std::optional<size_t> LruPolicy::ChooseVictim(const EvictionRequest& /*request*/,
                                              absl::Span<const EvictionCandidate> candidates) {
  size_t best = 0;
  for (size_t i = 1; i < candidates.size(); ++i) {
    const EvictionCandidate& c = candidates[i];
    const EvictionCandidate& b = candidates[best];
    if (c.last_use_tick < b.last_use_tick ||
        (c.last_use_tick == b.last_use_tick && !c.dirty && b.dirty)) {
      best = i;
    }
  }
  return best;
}

}  // namespace strata
