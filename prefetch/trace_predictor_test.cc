#include "prefetch/trace_predictor.h"

#include <vector>

#include "gtest/gtest.h"
#include "prefetch/access_predictor.h"

namespace strata {
namespace {

ShardKey K(uint32_t t) { return ShardKey{JobId(1), Rank(0), TensorId(t)}; }
std::vector<ShardKey> Seq(std::initializer_list<uint32_t> ts) {
  std::vector<ShardKey> out;
  for (uint32_t t : ts) out.push_back(K(t));
  return out;
}
using Match = TracePredictor::Match;

TEST(TracePredictorTest, FollowsTheLearnedTraceAndPredictsDistances) {
  TracePredictor p;
  p.Learn(Seq({1, 2, 3, 4, 2}));
  EXPECT_EQ(p.Observe(K(1)), Match::kMatched);
  EXPECT_EQ(p.NextUse(K(2)), 0);
  EXPECT_EQ(p.NextUse(K(4)), 2);
  EXPECT_EQ(p.NextUse(K(1)), 4);  // wraps into the next iteration
  EXPECT_EQ(p.NextUse(K(9)), kNeverUsed);
  EXPECT_EQ(p.Observe(K(2)), Match::kMatched);
  EXPECT_EQ(p.NextUse(K(2)), 2);  // its second use in the iteration
}

TEST(TracePredictorTest, ResyncsAfterASkippedAccess) {
  TracePredictor p;
  p.Learn(Seq({1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(p.Observe(K(1)), Match::kMatched);
  EXPECT_EQ(p.Observe(K(3)), Match::kSkipped);  // 2 did not happen
  EXPECT_EQ(p.position(), 3u);
  EXPECT_EQ(p.Observe(K(4)), Match::kMatched);
  EXPECT_EQ(p.NextUse(K(5)), 0);
}

TEST(TracePredictorTest, AnExtraAccessKeepsThePosition) {
  TracePredictor p;
  p.Learn(Seq({1, 2, 3}));
  EXPECT_EQ(p.Observe(K(1)), Match::kMatched);
  EXPECT_EQ(p.Observe(K(42)), Match::kExtra);
  EXPECT_EQ(p.Observe(K(2)), Match::kMatched);
  EXPECT_EQ(p.Observe(K(3)), Match::kMatched);
}

TEST(TracePredictorTest, LostPredictorFindsItsPlaceFurtherOn) {
  TracePredictor p({.resync_window = 2, .lost_after = 2});
  p.Learn(Seq({1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(p.Observe(K(1)), Match::kMatched);
  EXPECT_EQ(p.Observe(K(50)), Match::kExtra);
  EXPECT_EQ(p.Observe(K(8)), Match::kResynced);  // beyond the window, found by search
  EXPECT_EQ(p.NextUse(K(9)), 0);
}

TEST(TracePredictorTest, OneSmallDeviationDoesNotDropTheTrace) {
  TracePredictor p;
  std::vector<ShardKey> trace;
  for (uint32_t t = 0; t < 40; ++t) trace.push_back(K(t));
  p.Learn(trace);
  std::vector<ShardKey> recorded = trace;
  recorded.erase(recorded.begin() + 10);  // one access skipped this time
  for (const ShardKey& k : recorded) p.Observe(k);
  EXPECT_FALSE(p.EndIteration(recorded, trace));
  EXPECT_EQ(p.trace(), trace);
  EXPECT_EQ(p.relearns(), 0u);
  EXPECT_EQ(p.position(), 0u);
}

TEST(TracePredictorTest, TheSameDeviationTwiceIsLearned) {
  TracePredictor p;
  std::vector<ShardKey> trace;
  for (uint32_t t = 0; t < 40; ++t) trace.push_back(K(t));
  p.Learn(trace);
  std::vector<ShardKey> recorded = trace;
  recorded.insert(recorded.begin() + 5, K(99));
  for (const ShardKey& k : recorded) p.Observe(k);
  EXPECT_FALSE(p.EndIteration(recorded, trace));
  for (const ShardKey& k : recorded) p.Observe(k);
  EXPECT_TRUE(p.EndIteration(recorded, recorded));
  EXPECT_EQ(p.trace(), recorded);
}

TEST(TracePredictorTest, ARealChangeIsRelearnedAtTheBoundary) {
  TracePredictor p;
  p.Learn(Seq({1, 2, 3, 4, 5, 6, 7, 8}));
  const std::vector<ShardKey> changed = Seq({8, 7, 6, 5, 4, 3, 2, 1});
  for (const ShardKey& k : changed) p.Observe(k);
  EXPECT_GT(p.deviations(), 2u);
  EXPECT_TRUE(p.EndIteration(changed, {}));
  EXPECT_EQ(p.trace(), changed);
  EXPECT_EQ(p.Observe(K(8)), Match::kMatched);
}

}  // namespace
}  // namespace strata
