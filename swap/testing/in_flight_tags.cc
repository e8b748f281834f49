#include "swap/testing/in_flight_tags.h"

namespace strata {

void InFlightTags::Add(uint64_t offset, uint64_t length, uint64_t tag) {
  absl::MutexLock lock(&mu_);
  ranges_.emplace(offset, Range{offset + length, tag});
}

void InFlightTags::Remove(uint64_t offset, uint64_t length, uint64_t tag) {
  absl::MutexLock lock(&mu_);
  auto [first, last] = ranges_.equal_range(offset);
  for (auto it = first; it != last; ++it) {
    if (it->second.end == offset + length && it->second.tag == tag) {
      ranges_.erase(it);
      return;
    }
  }
}

std::optional<uint64_t> InFlightTags::TagAt(uint64_t offset) const {
  absl::MutexLock lock(&mu_);
  // Ranges in flight are few (a lane's queue); walk those starting at or
  // before `offset`, nearest first.
  auto it = ranges_.upper_bound(offset);
  while (it != ranges_.begin()) {
    --it;
    if (offset < it->second.end) return it->second.tag;
  }
  return std::nullopt;
}

}  // namespace strata
