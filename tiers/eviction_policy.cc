#include "tiers/eviction_policy.h"

namespace strata {

std::optional<size_t> LruPolicy::ChooseVictim(const EvictionRequest& /*request*/,
                                              absl::Span<const EvictionCandidate> candidates) {
  std::optional<size_t> found;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const EvictionCandidate& c = candidates[i];
    if (c.pinned) continue;
    if (!found.has_value()) {
      found = i;
      continue;
    }
    const size_t best = *found;
    const EvictionCandidate& b = candidates[best];
    if (c.last_use_tick < b.last_use_tick ||
        (c.last_use_tick == b.last_use_tick && !c.dirty && b.dirty)) {
      found = i;
    }
  }
  return found;
}

}  // namespace strata
