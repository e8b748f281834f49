#include "tiers/slot_allocator.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// Fills `slots` with one-page slots of `a`, in order.
template <size_t N>
void AllocatePages(SlotAllocator& a, SlotRange (&slots)[N]) {
  for (SlotRange& x : slots) {
    auto s = a.Allocate(4096);
    ASSERT_TRUE(s.ok()) << s.status();
    x = *s;
  }
}

TEST(SlotAllocatorTest, RoundsUpToAlignmentAndRunsOutAtCapacity) {
  SlotAllocator a(16384, 4096);
  auto first = a.Allocate(1);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->offset_bytes, 0u);
  EXPECT_EQ(first->size_bytes, 4096u);
  auto second = a.Allocate(8192);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->offset_bytes, 4096u);
  EXPECT_EQ(a.used_bytes(), 12288u);
  auto third = a.Allocate(8192);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(a.Allocate(4096).ok());
}

TEST(SlotAllocatorTest, FreeCoalescesNeighboursSoLargeSlotsFitAgain) {
  SlotAllocator a(4 * 4096, 4096);
  SlotRange r[4];
  ASSERT_NO_FATAL_FAILURE(AllocatePages(a, r));
  a.Free(r[1]);
  a.Free(r[3]);
  EXPECT_EQ(a.largest_free_bytes(), 4096u);
  EXPECT_FALSE(a.Allocate(8192).ok());
  a.Free(r[2]);  // joins 1..3
  EXPECT_EQ(a.largest_free_bytes(), 3 * 4096u);
  auto big = a.Allocate(3 * 4096);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->offset_bytes, 4096u);
  a.Free(r[0]);
  a.Free(*big);
  EXPECT_EQ(a.used_bytes(), 0u);
  EXPECT_EQ(a.largest_free_bytes(), 4 * 4096u);
}

// A refusal says which case it is: free bytes that would cover the request
// but in no single range ("fragmented"), or too few free bytes ("full"); and
// the owner can see which slot's freeing would mend it.
TEST(SlotAllocatorTest, ARefusalSaysFragmentedOrFullAndFreeRangeAfterFreeingSeesNeighbours) {
  SlotAllocator a(6 * 4096, 4096);
  SlotRange r[6];
  ASSERT_NO_FATAL_FAILURE(AllocatePages(a, r));
  a.Free(r[1]);
  a.Free(r[4]);
  EXPECT_EQ(a.free_bytes(), 2 * 4096u);
  auto fragmented = a.Allocate(8192);
  ASSERT_EQ(fragmented.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(fragmented.status().message(), "fragmented")) << fragmented.status();
  auto full = a.Allocate(3 * 4096);
  ASSERT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(absl::StartsWith(full.status().message(), "full")) << full.status();
  EXPECT_EQ(a.FreeRangeAfterFreeing(r[0]), 2 * 4096u);  // joins 1
  EXPECT_EQ(a.FreeRangeAfterFreeing(r[2]), 2 * 4096u);  // joins 1
  EXPECT_EQ(a.FreeRangeAfterFreeing(r[3]), 2 * 4096u);  // joins 4
  EXPECT_EQ(a.FreeRangeAfterFreeing(r[5]), 2 * 4096u);  // joins 4
  a.Free(r[2]);
  EXPECT_EQ(a.FreeRangeAfterFreeing(r[3]), 4 * 4096u);  // joins 1..2 and 4
  EXPECT_EQ(a.FreeRangeAfterFreeing(r[0]), 3 * 4096u);
  a.Free(r[3]);
  EXPECT_EQ(a.largest_free_bytes(), 4 * 4096u);
}

// Two-ended placement: large slots (more than half the largest asked for)
// first fit from the bottom, small ones last fit from the top, so freeing
// the small ones never leaves the large ones' range splintered.
TEST(SlotAllocatorTest, TwoEndedPlacementKeepsSmallSlotsAtTheTop) {
  constexpr uint64_t kKiB = 1024;
  SlotAllocator a(96 * kKiB, 4096, SlotAllocator::Placement::kTwoEnded);
  auto big1 = a.Allocate(32 * kKiB);
  auto small1 = a.Allocate(16 * kKiB);  // exactly half: small
  auto small2 = a.Allocate(4 * kKiB);
  auto big2 = a.Allocate(24 * kKiB);  // more than half: large
  ASSERT_TRUE(big1.ok() && small1.ok() && small2.ok() && big2.ok());
  EXPECT_EQ(big1->offset_bytes, 0u);
  EXPECT_EQ(small1->offset_bytes, 80 * kKiB);
  EXPECT_EQ(small2->offset_bytes, 76 * kKiB);
  EXPECT_EQ(big2->offset_bytes, 32 * kKiB);
  // The free space is one range in the middle, and stays one when the small
  // slots go: first fit alone would have put them between the large ones.
  EXPECT_EQ(a.largest_free_bytes(), 20 * kKiB);
  a.Free(*small1);
  a.Free(*small2);
  EXPECT_EQ(a.largest_free_bytes(), 40 * kKiB);
  auto big3 = a.Allocate(32 * kKiB);
  ASSERT_TRUE(big3.ok());
  EXPECT_EQ(big3->offset_bytes, 56 * kKiB);
  // A small slot takes the highest range that holds it; when none does it is
  // refused the same way ("fragmented" or "full").
  a.Free(*big1);
  auto small3 = a.Allocate(8 * kKiB);
  ASSERT_TRUE(small3.ok());
  EXPECT_EQ(small3->offset_bytes, 88 * kKiB);
  EXPECT_EQ(a.used_bytes(), 64 * kKiB);
  auto too_big = a.Allocate(40 * kKiB);
  EXPECT_TRUE(absl::StartsWith(too_big.status().message(), "full")) << too_big.status();
}

}  // namespace
}  // namespace strata
