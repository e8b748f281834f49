#include "tiers/slot_allocator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"
#include "core/status_macros.h"

namespace strata {

SlotAllocator::SlotAllocator(uint64_t capacity_bytes, uint64_t alignment_bytes, Placement placement)
    : capacity_bytes_(capacity_bytes), alignment_bytes_(alignment_bytes), placement_(placement) {
  STRATA_CHECK(alignment_bytes > 0 && (alignment_bytes & (alignment_bytes - 1)) == 0);
  STRATA_CHECK(capacity_bytes % alignment_bytes == 0);
  if (capacity_bytes > 0) free_[0] = capacity_bytes;
}

uint64_t SlotAllocator::RoundUp(uint64_t size_bytes) const {
  return (size_bytes + alignment_bytes_ - 1) & ~(alignment_bytes_ - 1);
}

uint64_t SlotAllocator::largest_free_bytes() const {
  uint64_t largest = 0;
  for (const auto& [offset, length] : free_) largest = std::max(largest, length);
  return largest;
}

absl::StatusOr<SlotRange> SlotAllocator::Allocate(uint64_t size_bytes) {
  const uint64_t need = RoundUp(std::max<uint64_t>(size_bytes, 1));
  if (placement_ == Placement::kTwoEnded && need <= capacity_bytes_) {
    largest_request_ = std::max(largest_request_, need);
    if (need * 2 <= largest_request_) {
      // Small: last fit, carved from the top of the highest range that holds it.
      for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
        if (it->second < need) continue;
        it->second -= need;
        const uint64_t offset = it->first + it->second;
        if (it->second == 0) free_.erase(std::next(it).base());
        used_bytes_ += need;
        return SlotRange{offset, need};
      }
      return Refusal(need);
    }
    // Large: first fit from the bottom (below).
  }
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_[offset + need] = rest;
    used_bytes_ += need;
    return SlotRange{offset, need};
  }
  return Refusal(need);
}

absl::Status SlotAllocator::Refusal(uint64_t need) const {
  if (free_bytes() >= need) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "fragmented: no free range of ", FormatBytes(need), " although ", FormatBytes(free_bytes()),
        " are free (largest free range ", FormatBytes(largest_free_bytes()), ")"));
  }
  return absl::ResourceExhaustedError(absl::StrCat("full: ", FormatBytes(need), " requested, ",
                                                   FormatBytes(free_bytes()), " free (largest free range ",
                                                   FormatBytes(largest_free_bytes()), ")"));
}

uint64_t SlotAllocator::FreeRangeAfterFreeing(SlotRange range) const {
  uint64_t length = range.size_bytes;
  auto next = free_.lower_bound(range.offset_bytes);
  if (next != free_.end() && range.offset_bytes + range.size_bytes == next->first) length += next->second;
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == range.offset_bytes) length += prev->second;
  }
  return length;
}

void SlotAllocator::Free(SlotRange range) {
  STRATA_CHECK(range.size_bytes > 0 && range.size_bytes <= used_bytes_);
  used_bytes_ -= range.size_bytes;
  uint64_t offset = range.offset_bytes;
  uint64_t length = range.size_bytes;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + length == next->first) {
    length += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += length;
      return;
    }
  }
  free_[offset] = length;
}

}  // namespace strata
