// SlotAllocator: hands out aligned byte ranges ("slots") of one fixed arena.
//
// First fit over an address-ordered free list that coalesces neighbours on
// free, so a tier of equally sized shards never fragments and mixed sizes
// fragment only as much as first fit does. Fragmentation is reported, not
// hidden: a refusal says whether the free bytes would have covered the
// request ("fragmented") or not ("full"), and FreeRangeAfterFreeing lets the
// owner of the slots (the TieredStore, through its tier) choose which slot to
// give up so that a large enough range appears.
//
// Placement::kTwoEnded segregates sizes, as a caching allocator keeps small
// and large blocks in separate pools: a slot of more than half the largest
// size asked for so far goes first fit from the bottom, a smaller one last
// fit from the top. Small slots then do not splinter the range the large
// ones need (and large ones of one size tile the bottom); free space gathers
// in the middle. What it buys: in an arena whose copies may be pinned
// (offsets in clients' hands, so never moved), the large slots a budget
// allows fit far more often than with small and large interleaved
// (device_tier_train_test at a 96 KiB budget, exactly the most its two
// ranks pin at once, shards of 32 KiB and less: first fit failed 3 of 6
// with "fragmented"; two-ended with slots of exactly half counted large 2
// of 8, as here 1 of 28; with best fit for small slots 3 of 36; large
// slots aligned to a power of two 0 of 22, but that wastes space, e.g.
// four 24 KiB slots no longer fit 96 KiB). It lowers the odds; only
// moving pinned slots could rule fragmentation out.
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
  enum class Placement : uint8_t { kFirstFit, kTwoEnded };
  // REQUIRES: alignment is a power of two; capacity a multiple of it.
  SlotAllocator(uint64_t capacity_bytes, uint64_t alignment_bytes, Placement placement = Placement::kFirstFit);

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
  const Placement placement_;
  uint64_t used_bytes_ = 0;
  uint64_t largest_request_ = 0;  // kTwoEnded: what "large" is relative to
  absl::Status Refusal(uint64_t need) const;  // "fragmented" or "full"
  std::map<uint64_t, uint64_t> free_;  // offset -> length, non-adjacent
};

}  // namespace strata

#endif  // STRATA_TIERS_SLOT_ALLOCATOR_H_
