#include "prefetch/prefetch_scheduler.h"

#include <vector>

#include "gtest/gtest.h"
#include "prefetch/farthest_next_use_policy.h"
#include "prefetch/oracle_predictor.h"
#include "tiers/testing/store_world.h"

namespace strata {
namespace {

constexpr size_t kShard = 64 << 10;  // 8 fit in the device tier

TEST(PrefetchSchedulerTest, PromotesThePredictedWindowInOrderWithinItsBounds) {
  std::vector<ShardKey> sequence;
  for (uint32_t t = 1; t <= 6; ++t) sequence.push_back(TestKey(t));
  OracleAccessPredictor oracle(sequence);
  FarthestNextUsePolicy policy(&oracle);
  auto world = StoreWorld::Create({.executor_threads = 0, .policy = &policy});
  ASSERT_TRUE(world.ok());
  TieredStore& store = *(*world)->store;
  for (uint32_t t = 1; t <= 6; ++t) {
    ASSERT_TRUE(store.AddShard(TestKey(t), TierKind::kPinnedHost, Filled(kShard, t)).ok());
  }
  PrefetchScheduler scheduler(&store, &oracle,
                              {.lookahead_count = 4, .lookahead_bytes = 3 * kShard});
  std::vector<IssuedPrefetch> issued = scheduler.Pump();
  ASSERT_EQ(issued.size(), 3u);  // the byte bound stops it before the 4th
  EXPECT_EQ(issued[0].key, TestKey(1));
  EXPECT_EQ(issued[2].key, TestKey(3));
  EXPECT_TRUE(store.IsResident(TestKey(3), TierKind::kDevice));
  EXPECT_TRUE(scheduler.Pump().empty());  // nothing new in the window
  oracle.Advance();
  issued = scheduler.Pump();
  ASSERT_EQ(issued.size(), 1u);
  EXPECT_EQ(issued[0].key, TestKey(4));
  EXPECT_EQ(store.stats().prefetches_issued, 4u);
}

TEST(PrefetchSchedulerTest, StopsRatherThanEvictWhatIsNeededSooner) {
  // Device holds 8; the sequence needs 1..8 now and 9 later.
  std::vector<ShardKey> sequence;
  for (uint32_t t = 1; t <= 9; ++t) sequence.push_back(TestKey(t));
  OracleAccessPredictor oracle(sequence);
  FarthestNextUsePolicy policy(&oracle);
  auto world = StoreWorld::Create({.executor_threads = 0, .policy = &policy});
  ASSERT_TRUE(world.ok());
  TieredStore& store = *(*world)->store;
  for (uint32_t t = 1; t <= 9; ++t) {
    ASSERT_TRUE(store.AddShard(TestKey(t), TierKind::kPinnedHost, Filled(kShard, t)).ok());
  }
  PrefetchScheduler scheduler(&store, &oracle, {.lookahead_count = 16, .max_in_flight = 16});
  EXPECT_EQ(scheduler.Pump().size(), 8u);
  EXPECT_EQ(scheduler.stats().refused, 1u);
  EXPECT_FALSE(store.IsResident(TestKey(9), TierKind::kDevice));
  oracle.Advance();  // 1 was used and is never needed again
  std::vector<IssuedPrefetch> issued = scheduler.Pump();
  ASSERT_EQ(issued.size(), 1u);
  EXPECT_EQ(issued[0].key, TestKey(9));
  EXPECT_FALSE(store.IsResident(TestKey(1), TierKind::kDevice));
}

// Fills the device tier (8 slots) with shards 1..8 of a world holding 1..10.
TieredStore& FillDevice(StoreWorld& world) {
  TieredStore& store = *world.store;
  for (uint32_t t = 1; t <= 10; ++t) {
    EXPECT_TRUE(store.AddShard(TestKey(t), TierKind::kPinnedHost, Filled(kShard, t)).ok());
  }
  for (uint32_t t = 1; t <= 8; ++t) {
    auto promoted = store.Promote(TestKey(t), TierKind::kDevice);
    EXPECT_TRUE(promoted.ok());
  }
  return store;
}

// Shard 9 is needed at distance 1; MIN would make its room by dropping 1
// after 1's use at distance 0, so a non-urgent prefetch is refused. The
// urgent path would evict 8 (the farthest next use) now, but MIN keeps 8
// until it is used: urgency would cost a fetch MIN does not make, so the
// adaptive rule withholds it and 8 stays.
TEST(PrefetchSchedulerTest, AdaptiveUrgencyWithheldWhenMinWouldKeepTheVictim) {
  std::vector<ShardKey> sequence;
  for (uint32_t t : {1, 9, 2, 3, 4, 5, 6, 7, 8, 1}) sequence.push_back(TestKey(t));
  OracleAccessPredictor oracle(sequence);
  FarthestNextUsePolicy policy(&oracle);
  auto world = StoreWorld::Create({.executor_threads = 0, .policy = &policy});
  ASSERT_TRUE(world.ok());
  TieredStore& store = FillDevice(**world);
  PrefetchScheduler scheduler(&store, &oracle, {.lookahead_count = 2, .urgent_distance = 2});
  EXPECT_TRUE(scheduler.Pump().empty());
  EXPECT_EQ(scheduler.stats().urgency_withheld, 1u);
  EXPECT_EQ(scheduler.stats().refused, 1u);
  EXPECT_TRUE(store.IsResident(TestKey(8), TierKind::kDevice));
  EXPECT_FALSE(store.IsResident(TestKey(9), TierKind::kDevice));

  // The fixed rule (adaptive_urgency off) evicts 8 at once.
  auto fixed_world = StoreWorld::Create({.executor_threads = 0, .policy = &policy});
  ASSERT_TRUE(fixed_world.ok());
  TieredStore& fixed_store = FillDevice(**fixed_world);
  PrefetchScheduler fixed(&fixed_store, &oracle,
                          {.lookahead_count = 2, .urgent_distance = 2, .adaptive_urgency = false});
  ASSERT_EQ(fixed.Pump().size(), 1u);
  EXPECT_EQ(fixed.stats().urgent, 1u);
  EXPECT_FALSE(fixed_store.IsResident(TestKey(8), TierKind::kDevice));
}

// Here MIN itself drops 8 before its use (at the miss on 10, after 1 went at
// the miss on 9), so evicting 8 now costs nothing extra: the prefetch goes
// urgent and 9 arrives ahead of its use.
TEST(PrefetchSchedulerTest, AdaptiveUrgencyGrantedWhenMinDropsTheVictimAnyway) {
  std::vector<ShardKey> sequence;
  for (uint32_t t : {1, 9, 10, 9, 2, 3, 4, 5, 6, 7, 8, 1}) sequence.push_back(TestKey(t));
  OracleAccessPredictor oracle(sequence);
  FarthestNextUsePolicy policy(&oracle);
  auto world = StoreWorld::Create({.executor_threads = 0, .policy = &policy});
  ASSERT_TRUE(world.ok());
  TieredStore& store = FillDevice(**world);
  PrefetchScheduler scheduler(&store, &oracle, {.lookahead_count = 2, .urgent_distance = 2});
  std::vector<IssuedPrefetch> issued = scheduler.Pump();
  ASSERT_EQ(issued.size(), 1u);
  EXPECT_EQ(issued[0].key, TestKey(9));
  EXPECT_EQ(scheduler.stats().urgent, 1u);
  EXPECT_EQ(scheduler.stats().urgency_withheld, 0u);
  EXPECT_FALSE(store.IsResident(TestKey(8), TierKind::kDevice));
  EXPECT_TRUE(store.IsResident(TestKey(1), TierKind::kDevice));
}

// The early write-back cleans the copy MIN will drop to make room, ranked by
// its use after the waiting shard's (NextUseFrom), not by its next use: here
// the dirty copy in use now (1), whose next use is near but whose use after
// the waiting shard is the farthest.
TEST(PrefetchSchedulerTest, EarlyWriteBackCleansMinsVictimAtTheWaitingShard) {
  std::vector<ShardKey> sequence;
  for (uint32_t t : {1, 9, 2, 3, 4, 5, 6, 7, 8, 1}) sequence.push_back(TestKey(t));
  OracleAccessPredictor oracle(sequence);
  FarthestNextUsePolicy policy(&oracle);
  auto world = StoreWorld::Create({.executor_threads = 0, .policy = &policy});
  ASSERT_TRUE(world.ok());
  TieredStore& store = FillDevice(**world);
  // Dirty 1 and 8.
  for (uint32_t t : {1u, 8u}) {
    auto lease = store.Acquire(TestKey(t), TierKind::kDevice, AccessMode::kWrite);
    ASSERT_TRUE(lease.ok());
    ASSERT_TRUE(store.Release(lease->id, /*dirty=*/true).ok());
  }
  PrefetchScheduler scheduler(&store, &oracle, {.lookahead_count = 2, .urgent_distance = 0});
  std::vector<IssuedPrefetch> issued = scheduler.Pump();
  ASSERT_EQ(issued.size(), 1u);
  EXPECT_TRUE(issued[0].write_back);
  EXPECT_EQ(issued[0].key, TestKey(1));
}

}  // namespace
}  // namespace strata
