// SlotAllocator: hands out aligned byte ranges ("slots") of one fixed arena.
//
// First fit over an address-ordered free list that coalesces neighbours on
// free, so a tier of equally sized shards never fragments and mixed sizes
// fragment only as much as first fit does. Fragmentation is reported, not
// hidden: a refusal says whether the free bytes would have covered the
// request ("fragmented") or not ("full"), and FreeRangeAfterFreeing lets the
// owner of the slots (the TieredStore, through its tier) choose which slot to
// give up so that a large enough range appears. Every slot starts at a multiple of
// `alignment` and its length is rounded up to one, which is what O_DIRECT
// needs of buffers (4 KiB covers every NVMe device we target) and what keeps
// device copies on full cache lines.
//
// Thread-compatible: the owning tier serializes calls.
#ifndef STRATA_TIERS_SLOT_ALLOCATOR_H_
#define STRATA_TIERS_SLOT_ALLOCATOR_H_

#include <cstdint>
#include <map>

#include "absl/status/statusor.h"

namespace strata {

struct SlotRange {
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;  // rounded up to the alignment
};

class SlotAllocator {
 public:
  // REQUIRES: alignment is a power of two; capacity a multiple of it.
  SlotAllocator(uint64_t capacity_bytes, uint64_t alignment_bytes);

  // ResourceExhausted when no free range is large enough. The message gives
  // the request, the free bytes and the largest free range, and starts with
  // "fragmented" when the free bytes would cover the request, else "full".
  absl::StatusOr<SlotRange> Allocate(uint64_t size_bytes);
  // REQUIRES: `range` came from Allocate and was not freed since.
  void Free(SlotRange range);

  uint64_t RoundUp(uint64_t size_bytes) const;
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t free_bytes() const { return capacity_bytes_ - used_bytes_; }
  uint64_t largest_free_bytes() const;
  // The length of the free range that Free(range) would leave: the range
  // itself joined with the free ranges right before and after it.
  // REQUIRES: `range` is allocated.
  uint64_t FreeRangeAfterFreeing(SlotRange range) const;

 private:
  const uint64_t capacity_bytes_;
  const uint64_t alignment_bytes_;
  uint64_t used_bytes_ = 0;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, non-adjacent
};

}  // namespace strata

#endif  // STRATA_TIERS_SLOT_ALLOCATOR_H_
