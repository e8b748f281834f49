#include "prefetch/farthest_next_use_policy.h"

#include <vector>

#include "gtest/gtest.h"
#include "prefetch/oracle_predictor.h"

namespace strata {
namespace {

ShardKey K(uint32_t t) { return ShardKey{JobId(1), Rank(0), TensorId(t)}; }

TEST(FarthestNextUsePolicyTest, EvictsTheCopyNeededLast) {
  OracleAccessPredictor oracle({K(1), K(2), K(3), K(1), K(2)});
  FarthestNextUsePolicy policy(&oracle);
  std::vector<EvictionCandidate> c = {{K(1)}, {K(2)}, {K(4)}};
  EXPECT_EQ(policy.ChooseVictim({TierKind::kDevice, K(3), true}, c), 2u);  // 4: never
  c.pop_back();
  EXPECT_EQ(policy.ChooseVictim({TierKind::kDevice, K(3), true}, c), 1u);  // 2 at 1
}

TEST(FarthestNextUsePolicyTest, PrefetchNeverEvictsSomethingNeededSooner) {
  OracleAccessPredictor oracle({K(1), K(2), K(3)});
  FarthestNextUsePolicy policy(&oracle);
  std::vector<EvictionCandidate> c = {{K(1)}, {K(2)}};
  EXPECT_EQ(policy.ChooseVictim({TierKind::kDevice, K(3), /*demand=*/false}, c), std::nullopt);
  // On a demand miss someone must go.
  EXPECT_EQ(policy.ChooseVictim({TierKind::kDevice, K(3), /*demand=*/true}, c), 1u);
  oracle.Advance();  // 1 is done with and never used again
  EXPECT_EQ(policy.ChooseVictim({TierKind::kDevice, K(3), false}, c), 0u);
}

TEST(FarthestNextUsePolicyTest, UnpredictedCopiesGoLeastRecentlyUsedFirst) {
  OracleAccessPredictor oracle({});
  FarthestNextUsePolicy policy(&oracle);
  std::vector<EvictionCandidate> c = {{K(1), 0, 5}, {K(2), 0, 3}, {K(3), 0, 9}};
  EXPECT_EQ(policy.ChooseVictim({TierKind::kDevice, K(4), true}, c), 1u);
}

}  // namespace
}  // namespace strata
