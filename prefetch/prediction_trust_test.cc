#include "prefetch/prediction_trust.h"

#include <memory>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "gtest/gtest.h"
#include "prefetch/farthest_next_use_policy.h"
#include "prefetch/learned_predictor.h"
#include "prefetch/oracle_predictor.h"
#include "prefetch/prefetch_scheduler.h"
#include "tiers/testing/store_world.h"

namespace strata {
namespace {

ShardKey K(uint32_t t) { return ShardKey{JobId(1), Rank(0), TensorId(t)}; }

// A predictor that says what the test tells it: a fixed next use per key.
class StubPredictor final : public AccessPredictor {
 public:
  double NextUse(const ShardKey& key) const override {
    auto it = next_.find(key);
    return it == next_.end() ? kNeverUsed : it->second;
  }
  double NextUseFrom(const ShardKey& key, double) const override { return NextUse(key); }
  std::vector<PredictedAccess> Upcoming(size_t) const override { return {}; }
  void Set(const ShardKey& key, double next) { next_[key] = next; }

 private:
  absl::flat_hash_map<ShardKey, double> next_;
};

std::unique_ptr<PredictionTrust> MakeTrust(size_t capacity, double half_life = 512,
                                           double hysteresis = 1.0) {
  auto trust = PredictionTrust::Create({.capacity_shards = capacity,
                                        .half_life_accesses = half_life,
                                        .hysteresis_misses = hysteresis});
  EXPECT_TRUE(trust.ok()) << trust.status();
  return std::move(*trust);
}

// A trust that has measured its prediction losing: the stub claims the hot
// key 1 is never used again while the job keeps coming back to it (and the
// one-off keys are said to come back, beyond the tier's reach of 2).
std::unique_ptr<PredictionTrust> Distrusted(StubPredictor& stub) {
  auto trust = MakeTrust(2);
  stub.Set(K(1), kNeverUsed);
  for (uint32_t t = 2; t < 20; ++t) {
    stub.Set(K(t), 5);
    trust->OnAccess(K(1), stub);
    trust->OnAccess(K(t), stub);
  }
  EXPECT_FALSE(trust->Trusted());
  return trust;
}

TEST(PredictionTrustTest, RejectsBadOptions) {
  EXPECT_FALSE(PredictionTrust::Create({.capacity_shards = 0}).ok());
  EXPECT_FALSE(PredictionTrust::Create({.capacity_shards = 4, .half_life_accesses = 0}).ok());
  EXPECT_FALSE(PredictionTrust::Create({.capacity_shards = 4, .hysteresis_misses = -1}).ok());
}

// Misses are counted in each shadow cache and decay with the half-life.
TEST(PredictionTrustTest, TracksMissesOfBothRulesWithDecay) {
  StubPredictor stub;
  auto trust = MakeTrust(2, /*half_life=*/1);
  trust->OnAccess(K(1), stub);  // both miss: 1
  trust->OnAccess(K(1), stub);  // both hit: halved
  EXPECT_DOUBLE_EQ(trust->predicted_score(), 0.5);
  EXPECT_DOUBLE_EQ(trust->recency_score(), 0.5);
  // A wrong prediction: 1 is said never to come back, 2 and 3 soon.
  stub.Set(K(1), kNeverUsed);
  stub.Set(K(2), 1);
  stub.Set(K(3), 1);
  trust->OnAccess(K(2), stub);  // both miss (cold)
  trust->OnAccess(K(3), stub);  // both miss
  trust->OnAccess(K(2), stub);  // both hit
  trust->OnAccess(K(1), stub);  // both miss
  trust->OnAccess(K(3), stub);
  // Both shadows drop 1 at the access to 3 (the prediction: it is never
  // used; recency: 2 is spared as predicted soon), and at the access to 1
  // both drop 3 (a tie at distance 1 / both spared: the less recently used),
  // so the last access misses in both: 5 misses each.
  const PredictionTrustStats s = trust->stats();
  EXPECT_EQ(s.accesses, 7u);
  EXPECT_EQ(s.predicted_misses, 5u);
  EXPECT_EQ(s.recency_misses, 5u);
  EXPECT_TRUE(trust->Trusted());  // a tie keeps the prediction
}

// Backing off: a prediction that keeps being wrong about a hot shard loses
// the duel; it is trusted again once it is right.
TEST(PredictionTrustTest, BacksOffWhenThePredictionLosesAndReturnsWhenItWins) {
  StubPredictor stub;
  auto trust = Distrusted(stub);
  const PredictionTrustStats lost = trust->stats();
  EXPECT_GT(lost.predicted_misses, lost.recency_misses);
  EXPECT_GT(lost.untrusted_accesses, 0u);
  // Now a cyclic scan of 6 keys through 2 slots: LRU misses every access,
  // the (now right) prediction keeps one of them.
  for (int round = 0; round < 40; ++round) {
    for (uint32_t t = 100; t < 106; ++t) {
      // Distances of the cyclic order seen from the access to t.
      for (uint32_t u = 100; u < 106; ++u) stub.Set(K(u), (u + 6 - t) % 6);
      trust->OnAccess(K(t), stub);
    }
  }
  EXPECT_TRUE(trust->Trusted());
  EXPECT_GE(trust->stats().switches, 2u);
}

// Random accesses around a hot set that changes every "iteration": the
// learned predictor's trace of the last iteration is wrong about this one,
// recency is right, so the trust backs off.
TEST(PredictionTrustTest, BacksOffOnARandomTrace) {
  LearnedPredictor predictor;
  auto trust = MakeTrust(6);
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> key(0, 39);
  std::uniform_int_distribution<uint32_t> pick(0, 3);
  for (int iteration = 0; iteration < 30; ++iteration) {
    std::vector<uint32_t> hot;
    for (int i = 0; i < 4; ++i) hot.push_back(key(rng));
    for (int pass = 0; pass < 10; ++pass) {
      const ShardKey k = K(hot[pick(rng)]);
      trust->OnAccess(k, predictor);
      predictor.OnAccess(k);
    }
    predictor.MarkIterationBoundary();
  }
  const PredictionTrustStats s = trust->stats();
  EXPECT_GT(s.predicted_misses, s.recency_misses);
  EXPECT_FALSE(trust->Trusted());
  EXPECT_GT(s.untrusted_accesses, s.accesses / 2);
}

// Full speed on a repeating trace: a loop over 16 shards through 6 slots.
// LRU misses every access, the learned prediction (MIN on the learned
// iteration) keeps 5 of the 6 slots useful, and it is never distrusted.
TEST(PredictionTrustTest, FullSpeedOnARepeatingTrace) {
  LearnedPredictor predictor;
  auto trust = MakeTrust(6);
  for (int iteration = 0; iteration < 10; ++iteration) {
    for (uint32_t i = 0; i < 16; ++i) {
      const ShardKey k = K(i);
      trust->OnAccess(k, predictor);
      predictor.OnAccess(k);
    }
    predictor.MarkIterationBoundary();
  }
  const PredictionTrustStats s = trust->stats();
  EXPECT_TRUE(trust->Trusted());
  EXPECT_EQ(s.untrusted_accesses, 0u);
  EXPECT_EQ(s.switches, 0u);
  EXPECT_LT(s.predicted_misses, s.recency_misses);
}

// While distrusted the policy pages by recency, sparing what the prediction
// says is needed soon, and refuses speculative evictions.
TEST(PredictionTrustTest, DistrustedPolicyUsesRecencyAndRefusesPrefetches) {
  StubPredictor stub;
  auto trust = Distrusted(stub);
  stub.Set(K(50), 100);
  stub.Set(K(51), 0);  // needed right away: spared
  stub.Set(K(52), 100);
  FarthestNextUsePolicy policy(&stub, trust.get());
  // {key, footprint, last_use_tick}
  std::vector<EvictionCandidate> c = {{K(50), 0, 5}, {K(51), 0, 1}, {K(52), 0, 3}};
  EXPECT_EQ(policy.ChooseVictim({TierKind::kDevice, K(60), /*demand=*/true}, c), 2u);
  EXPECT_EQ(policy.ChooseVictim({TierKind::kDevice, K(60), /*demand=*/false}, c), std::nullopt);
  // Trusted, the same request follows the prediction (farthest: 50 and 52
  // tie at 100, the less recently used 52 goes) and may prefetch.
  FarthestNextUsePolicy trusting(&stub);
  EXPECT_EQ(trusting.ChooseVictim({TierKind::kDevice, K(60), true}, c), 2u);
  stub.Set(K(60), 1);
  EXPECT_EQ(trusting.ChooseVictim({TierKind::kDevice, K(60), false}, c), 2u);
}

TEST(PredictionTrustTest, DistrustedSchedulerIssuesNothing) {
  StubPredictor stub;
  auto trust = Distrusted(stub);
  OracleAccessPredictor oracle({TestKey(1), TestKey(2)});
  FarthestNextUsePolicy policy(&oracle, trust.get());
  auto world = StoreWorld::Create({.executor_threads = 0, .policy = &policy});
  ASSERT_TRUE(world.ok());
  TieredStore& store = *(*world)->store;
  for (uint32_t t = 1; t <= 2; ++t) {
    ASSERT_TRUE(store.AddShard(TestKey(t), TierKind::kPinnedHost, Filled(64 << 10, t)).ok());
  }
  PrefetchScheduler scheduler(&store, &oracle, {.trust = trust.get()});
  EXPECT_TRUE(scheduler.Pump().empty());
  EXPECT_EQ(scheduler.stats().untrusted_pumps, 1u);
  EXPECT_EQ(store.stats().prefetches_issued, 0u);
  PrefetchScheduler full_speed(&store, &oracle, {});
  EXPECT_EQ(full_speed.Pump().size(), 2u);
}

}  // namespace
}  // namespace strata
