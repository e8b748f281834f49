#include "swap/extent_allocator.h"

#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr uint64_t kUnit = 64 << 10;

TEST(ExtentAllocatorTest, AllocatesRoundedExtentsAndFreesThem) {
  ExtentAllocator a(16 * kUnit, kUnit);
  uint64_t x = *a.Allocate(1);
  uint64_t y = *a.Allocate(kUnit + 1);
  EXPECT_EQ(x, 0u);
  EXPECT_EQ(y, kUnit);
  EXPECT_EQ(a.free_bytes(), 13 * kUnit);
  ASSERT_TRUE(a.Free(x, 1).ok());
  ASSERT_TRUE(a.Free(y, kUnit + 1).ok());
  EXPECT_EQ(a.free_bytes(), 16 * kUnit);
  // Coalesced back into one run.
  EXPECT_EQ(a.free_extent_count(), 1u);
  EXPECT_EQ(a.largest_free_extent_bytes(), 16 * kUnit);
}

TEST(ExtentAllocatorTest, BestFitReusesTheSmallestHole) {
  ExtentAllocator a(16 * kUnit, kUnit);
  uint64_t h1 = *a.Allocate(4 * kUnit);  // 0..4
  uint64_t keep1 = *a.Allocate(kUnit);   // 4
  uint64_t h2 = *a.Allocate(kUnit);      // 5
  uint64_t keep2 = *a.Allocate(kUnit);   // 6
  (void)keep1;
  (void)keep2;
  ASSERT_TRUE(a.Free(h1, 4 * kUnit).ok());
  ASSERT_TRUE(a.Free(h2, kUnit).ok());
  // A one-unit request takes the one-unit hole, not a piece of the big one.
  EXPECT_EQ(*a.Allocate(kUnit), h2);
  EXPECT_EQ(*a.Allocate(4 * kUnit), h1);
}

TEST(ExtentAllocatorTest, ExhaustionReportsFreeAndLargest) {
  ExtentAllocator a(4 * kUnit, kUnit);
  uint64_t a0 = *a.Allocate(kUnit);
  (void)*a.Allocate(kUnit);
  uint64_t a2 = *a.Allocate(kUnit);
  (void)*a.Allocate(kUnit);
  ASSERT_TRUE(a.Free(a0, kUnit).ok());
  ASSERT_TRUE(a.Free(a2, kUnit).ok());
  absl::StatusOr<uint64_t> r = a.Allocate(2 * kUnit);
  EXPECT_TRUE(absl::IsResourceExhausted(r.status()));
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("128.0 KiB free"));
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("largest free extent 64.0 KiB"));
}

TEST(ExtentAllocatorTest, DoubleFreeAndBadReserveAreRejected) {
  ExtentAllocator a(8 * kUnit, kUnit);
  uint64_t x = *a.Allocate(kUnit);
  ASSERT_TRUE(a.Free(x, kUnit).ok());
  EXPECT_TRUE(absl::IsInternal(a.Free(x, kUnit)));
  ASSERT_TRUE(a.Reserve(2 * kUnit, 2 * kUnit).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(a.Reserve(3 * kUnit, kUnit)));
  EXPECT_EQ(a.free_bytes(), 6 * kUnit);
}

TEST(ExtentAllocatorTest, RandomChurnKeepsAccountsAndCoalesces) {
  ExtentAllocator a(1024 * kUnit, kUnit);
  std::mt19937 rng(301);
  std::vector<std::pair<uint64_t, uint64_t>> live;
  uint64_t used = 0;
  for (int i = 0; i < 5000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      uint64_t len = (1 + rng() % 8) * kUnit;
      absl::StatusOr<uint64_t> off = a.Allocate(len);
      if (!off.ok()) continue;
      live.emplace_back(*off, len);
      used += len;
    } else {
      size_t k = rng() % live.size();
      ASSERT_TRUE(a.Free(live[k].first, live[k].second).ok());
      used -= live[k].second;
      live.erase(live.begin() + k);
    }
    ASSERT_EQ(a.free_bytes() + used, 1024 * kUnit);
  }
  for (auto [off, len] : live) ASSERT_TRUE(a.Free(off, len).ok());
  EXPECT_EQ(a.free_extent_count(), 1u);
}

}  // namespace
}  // namespace strata
