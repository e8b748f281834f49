// ExtentAllocator: hands out contiguous byte ranges of one preallocated data
// file.
//
// Best fit over a free list kept both by offset (to coalesce neighbours on
// free) and by size (to find the smallest run that fits in O(log n)). Sizes
// are rounded up to the allocation unit, so the number of distinct holes is
// bounded by capacity / unit, and best fit keeps large runs intact for large
// shards: shards of one job tend to have a handful of sizes, so freed extents
// are reused by same-size shards and fragmentation stays low.
//
// Thread-compatible.
#ifndef STRATA_SWAP_EXTENT_ALLOCATOR_H_
#define STRATA_SWAP_EXTENT_ALLOCATOR_H_

#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata {

class ExtentAllocator {
 public:
  // REQUIRES: unit_bytes a power of two; capacity_bytes a multiple of it.
  ExtentAllocator(uint64_t capacity_bytes, uint64_t unit_bytes);

  // Rounds `bytes` up to the unit. Returns the offset of a free extent of
  // that size; ResourceExhausted when none is large enough (the message gives
  // the free total and the largest free extent, so fragmentation is visible).
  absl::StatusOr<uint64_t> Allocate(uint64_t bytes);
  // Returns [offset, offset + RoundUp(bytes)) to the free list. Freeing what
  // is not allocated is Internal (a bug in the caller).
  absl::Status Free(uint64_t offset, uint64_t bytes);
  // Marks a specific range used (replaying a manifest). FailedPrecondition if
  // any of it is not free (two shards claim the same bytes).
  absl::Status Reserve(uint64_t offset, uint64_t bytes);

  uint64_t RoundUp(uint64_t bytes) const { return (bytes + unit_ - 1) & ~(unit_ - 1); }
  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t free_bytes() const { return free_; }
  uint64_t largest_free_extent_bytes() const;
  size_t free_extent_count() const { return by_offset_.size(); }

 private:
  void Insert(uint64_t offset, uint64_t len);
  void Erase(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_;
  uint64_t unit_;
  uint64_t free_;
  std::map<uint64_t, uint64_t> by_offset_;          // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (length, offset)
};

}  // namespace strata

#endif  // STRATA_SWAP_EXTENT_ALLOCATOR_H_
