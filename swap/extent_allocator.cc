#include "swap/extent_allocator.h"

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"

namespace strata {

ExtentAllocator::ExtentAllocator(uint64_t capacity_bytes, uint64_t unit_bytes)
    : capacity_(capacity_bytes), unit_(unit_bytes), free_(0) {
  if (capacity_ > 0) Insert(0, capacity_);
}

void ExtentAllocator::Insert(uint64_t offset, uint64_t len) {
  by_offset_.emplace(offset, len);
  by_size_.emplace(len, offset);
  free_ += len;
}

void ExtentAllocator::Erase(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  free_ -= it->second;
  by_offset_.erase(it);
}

uint64_t ExtentAllocator::largest_free_extent_bytes() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

absl::StatusOr<uint64_t> ExtentAllocator::Allocate(uint64_t bytes) {
  uint64_t len = RoundUp(bytes == 0 ? 1 : bytes);
  auto fit = by_size_.lower_bound({len, 0});
  if (fit == by_size_.end()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no free extent of ", FormatBytes(len), ": ", FormatBytes(free_), " free of ",
        FormatBytes(capacity_), ", largest free extent ", FormatBytes(largest_free_extent_bytes())));
  }
  uint64_t offset = fit->second;
  uint64_t hole = fit->first;
  Erase(by_offset_.find(offset));
  if (hole > len) Insert(offset + len, hole - len);
  return offset;
}

absl::Status ExtentAllocator::Free(uint64_t offset, uint64_t bytes) {
  uint64_t len = RoundUp(bytes == 0 ? 1 : bytes);
  if (offset % unit_ != 0 || offset + len > capacity_) {
    return absl::InternalError(absl::StrCat("freeing extent [", offset, ", +", len, ") outside the file"));
  }
  // Must not overlap a free neighbour.
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first < offset + len) {
    return absl::InternalError(absl::StrCat("double free of extent at ", offset));
  }
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > offset) {
      return absl::InternalError(absl::StrCat("double free of extent at ", offset));
    }
  }
  // Coalesce with neighbours so large shards keep finding room.
  uint64_t start = offset;
  uint64_t end = offset + len;
  next = by_offset_.lower_bound(offset);
  if (next != by_offset_.end() && next->first == end) {
    end += next->second;
    Erase(next);
  }
  auto after = by_offset_.lower_bound(offset);
  if (after != by_offset_.begin()) {
    auto prev = std::prev(after);
    if (prev->first + prev->second == start) {
      start = prev->first;
      Erase(prev);
    }
  }
  Insert(start, end - start);
  return absl::OkStatus();
}

absl::Status ExtentAllocator::Reserve(uint64_t offset, uint64_t bytes) {
  uint64_t len = RoundUp(bytes == 0 ? 1 : bytes);
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) {
    return absl::FailedPreconditionError(absl::StrCat("extent at ", offset, " is already in use"));
  }
  --it;
  uint64_t hole_start = it->first;
  uint64_t hole_end = it->first + it->second;
  if (offset < hole_start || offset + len > hole_end) {
    return absl::FailedPreconditionError(
        absl::StrCat("extent [", offset, ", +", len, ") is already in use or outside the file"));
  }
  Erase(it);
  if (offset > hole_start) Insert(hole_start, offset - hole_start);
  if (offset + len < hole_end) Insert(offset + len, hole_end - offset - len);
  return absl::OkStatus();
}

}  // namespace strata
