#include "prefetch/learned_predictor.h"

#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

ShardKey K(uint32_t t) { return ShardKey{JobId(1), Rank(0), TensorId(t)}; }

// Forward 0..n-1, backward n-1..0.
std::vector<ShardKey> Iteration(uint32_t n, uint32_t base = 0) {
  std::vector<ShardKey> out;
  for (uint32_t i = 0; i < n; ++i) out.push_back(K(base + i));
  for (uint32_t i = n; i-- > 0;) out.push_back(K(base + i));
  return out;
}

void Feed(LearnedPredictor& p, const std::vector<ShardKey>& seq, bool mark) {
  for (const ShardKey& k : seq) p.OnAccess(k);
  if (mark) p.MarkIterationBoundary();
}

// In the learning iteration nothing is known about the rest of it; the
// guess is that the iteration repeats, so a shard first used earlier in it
// is needed sooner in the next one. Nothing is prefetched from the guess.
TEST(LearnedPredictorTest, LearningIterationGuessesTheNextIterationsOrder) {
  LearnedPredictor p;
  for (uint32_t t : {3, 1, 2, 1}) p.OnAccess(K(t));
  EXPECT_LT(p.NextUse(K(3)), p.NextUse(K(1)));
  EXPECT_LT(p.NextUse(K(1)), p.NextUse(K(2)));
  EXPECT_EQ(p.NextUse(K(3)), 4);  // "half done": the next iteration 4 accesses away
  EXPECT_EQ(p.NextUse(K(9)), kNeverUsed);  // never seen
  for (const PredictedAccess& a : p.Upcoming(4)) EXPECT_NE(a.key, K(3));  // Markov's only
  EXPECT_TRUE(p.Sequence(4).empty());
  LearnedPredictorOptions no_guess;
  no_guess.guess_learning_iteration = false;
  LearnedPredictor off(no_guess);
  for (uint32_t t : {3, 1, 2, 1}) off.OnAccess(K(t));
  EXPECT_EQ(off.NextUse(K(3)), kNeverUsed);  // LRU until an iteration is learned
}

// The predicted sequence (repeats included) the scheduler replays MIN on:
// the rest of the learned iteration, then that iteration again.
TEST(LearnedPredictorTest, SequenceIsTheRestOfTheIterationThenItsRepeats) {
  LearnedPredictor p;
  EXPECT_TRUE(p.Sequence(5).empty());  // nothing learned yet
  Feed(p, Iteration(3), true);         // 0 1 2 2 1 0
  p.OnAccess(K(0));
  p.OnAccess(K(1));
  const std::vector<ShardKey> expected = {K(2), K(2), K(1), K(0), K(0), K(1), K(2), K(2), K(1)};
  EXPECT_EQ(p.Sequence(9), expected);
  EXPECT_EQ(p.Sequence(2), std::vector<ShardKey>({K(2), K(2)}));
}

// An expert (tensor 7, index 1) present in some iterations only: once its
// params are used in an iteration, its gradient later in that iteration is
// certain, so it is predicted at its slot, without the presence penalty,
// and prefetched.
TEST(LearnedPredictorTest, ATensorUsedThisIterationMakesItsOtherKindsCertain) {
  const ShardKey a = K(1), b = K(2), c = K(3);
  const ShardKey ep{JobId(1), Rank(0), TensorId(7), TensorKind::kParam16, 1};
  const ShardKey eg{JobId(1), Rank(0), TensorId(7), TensorKind::kGrad, 1};
  auto run = [&](bool route_expert) {
    LearnedPredictor p;
    Feed(p, {a, ep, b, eg, c}, true);
    Feed(p, {a, b, c}, true);
    Feed(p, {a, ep, b, eg, c}, true);
    Feed(p, {a, b, c}, true);
    Feed(p, {a, ep, b, eg, c}, true);
    p.OnAccess(a);
    if (route_expert) p.OnAccess(ep);
    return std::make_pair(p.NextUse(eg), p.Upcoming(4));
  };
  auto [routed_next, routed_upcoming] = run(true);
  EXPECT_EQ(routed_next, 1);  // b, then the expert's gradient
  bool prefetched = false;
  for (const PredictedAccess& u : routed_upcoming) prefetched |= u.key == eg;
  EXPECT_TRUE(prefetched);
  auto [unrouted_next, unrouted_upcoming] = run(false);
  EXPECT_GT(unrouted_next, 3);  // its slot (2 ahead) plus the presence penalty
  for (const PredictedAccess& u : unrouted_upcoming) EXPECT_NE(u.key, eg);
}

TEST(LearnedPredictorTest, LearnsAnIterationAndPredictsTheNext) {
  LearnedPredictor p;
  EXPECT_TRUE(p.Upcoming(4).empty());
  Feed(p, Iteration(6), true);
  p.OnAccess(K(0));
  p.OnAccess(K(1));
  std::vector<PredictedAccess> next = p.Upcoming(3);
  ASSERT_EQ(next.size(), 3u);
  EXPECT_EQ(next[0].key, K(2));
  EXPECT_EQ(next[1].key, K(3));
  EXPECT_EQ(next[2].key, K(4));
  EXPECT_EQ(p.NextUse(K(2)), 0);
  EXPECT_EQ(p.NextUse(K(1)), 8);  // in backward
  EXPECT_EQ(p.NextUse(K(5)), 3);
  EXPECT_EQ(p.stats().relearns, 1u);
}

TEST(LearnedPredictorTest, ResyncsAfterADeviationWithoutRelearning) {
  LearnedPredictor p;
  const std::vector<ShardKey> it = Iteration(20);
  Feed(p, it, true);
  std::vector<ShardKey> deviating = it;
  deviating.erase(deviating.begin() + 3);  // skipped K(3)
  for (size_t i = 0; i < 10; ++i) p.OnAccess(deviating[i]);
  // After the skip the prediction is back in step: deviating[10] is next.
  EXPECT_EQ(p.Upcoming(1).at(0).key, deviating[10]);
  for (size_t i = 10; i < deviating.size(); ++i) p.OnAccess(deviating[i]);
  p.MarkIterationBoundary();
  EXPECT_EQ(p.learned_trace(), it);  // a one-off: kept
  EXPECT_EQ(p.stats().relearns, 1u);
}

TEST(LearnedPredictorTest, RelearnsWhenThePatternChanges) {
  LearnedPredictor p;
  for (int i = 0; i < 3; ++i) Feed(p, Iteration(10), true);
  const std::vector<ShardKey> changed = Iteration(7, 100);
  Feed(p, changed, true);
  EXPECT_EQ(p.learned_trace(), changed);
  p.OnAccess(K(100));
  EXPECT_EQ(p.Upcoming(1).at(0).key, K(101));
}

TEST(LearnedPredictorTest, DetectsIterationBoundariesTheClientDidNotMark) {
  LearnedPredictor p;
  const std::vector<ShardKey> it = Iteration(8);
  Feed(p, it, true);  // the first iteration must be marked (or relearned)
  Feed(p, it, false);
  Feed(p, it, false);
  p.OnAccess(K(0));
  EXPECT_EQ(p.stats().detected_boundaries, 2u);
  EXPECT_EQ(p.stats().iterations, 3u);
  EXPECT_EQ(p.Upcoming(1).at(0).key, K(1));
  EXPECT_EQ(p.stats().deviations, 0u);
}

TEST(LearnedPredictorTest, ShardsUsedInFewIterationsArePredictedFartherAway) {
  LearnedPredictor p;
  // 1 -> (2 every iteration) -> (3 in odd iterations only) -> 4
  for (int i = 0; i < 8; ++i) {
    p.OnAccess(K(1));
    p.OnAccess(K(2));
    if (i % 2 == 1) p.OnAccess(K(3));
    p.OnAccess(K(4));
    p.MarkIterationBoundary();
  }
  p.OnAccess(K(1));
  EXPECT_EQ(p.NextUse(K(2)), 0);
  EXPECT_GT(p.NextUse(K(3)), p.NextUse(K(4)));
}

TEST(LearnedPredictorTest, MarkovFallbackPrefetchesTheLikelyExpert) {
  LearnedPredictor p;
  std::mt19937 rng(301);
  // Router 1 picks expert 10 nine times in ten, else expert 11; then 2.
  for (int i = 0; i < 40; ++i) {
    p.OnAccess(K(1));
    p.OnAccess(K(rng() % 10 == 0 ? 11 : 10));
    p.OnAccess(K(2));
    p.MarkIterationBoundary();
  }
  p.OnAccess(K(1));
  std::vector<PredictedAccess> next = p.Upcoming(2);
  ASSERT_FALSE(next.empty());
  EXPECT_EQ(next[0].key, K(10));
}

}  // namespace
}  // namespace strata
