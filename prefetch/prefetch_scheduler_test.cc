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

}  // namespace
}  // namespace strata
