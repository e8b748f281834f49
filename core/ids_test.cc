#include "core/ids.h"

#include <type_traits>

#include "absl/container/flat_hash_set.h"
#include "core/dtype.h"
#include "core/shard_key.h"
#include "core/tier_kind.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(StrongIdTest, DistinctTagsDoNotConvert) {
  static_assert(!std::is_convertible_v<JobId, Rank>);
  static_assert(!std::is_convertible_v<uint64_t, JobId>);
  EXPECT_LT(JobId(1), JobId(2));
}

TEST(ShardKeyTest, RoundTripsThroughItsText) {
  ShardKey key{JobId(7), Rank(3), TensorId(12), TensorKind::kExpAvgSq, 4};
  EXPECT_EQ(ShardKeyToString(key), "job7/rank3/t12/exp_avg_sq/4");
  auto parsed = ParseShardKey(ShardKeyToString(key));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, key);
  absl::flat_hash_set<ShardKey> set{key};
  EXPECT_TRUE(set.contains(*parsed));
  EXPECT_FALSE(ParseShardKey("job7/rank3/t12/bogus/4").ok());
  EXPECT_FALSE(ParseShardKey("job7/rank3").ok());
}

TEST(DTypeTest, ParsesTorchAndDeepSpeedSpellings) {
  EXPECT_EQ(*ParseDType("torch.bfloat16"), DType::kBf16);
  EXPECT_EQ(*ParseDType("half"), DType::kFp16);
  EXPECT_EQ(*ParseDType("FP32"), DType::kFp32);
  EXPECT_EQ(DTypeSize(DType::kBf16), 2u);
  EXPECT_FALSE(ParseDType("int8").ok());
}

TEST(TierKindTest, ParsesDeepSpeedOffloadDevices) {
  EXPECT_EQ(*ParseTierKind("cpu"), TierKind::kPinnedHost);
  EXPECT_EQ(*ParseTierKind("nvme"), TierKind::kNvme);
  EXPECT_EQ(TierKindName(TierKind::kDevice), "device");
  EXPECT_FALSE(ParseTierKind("tape").ok());
}

}  // namespace
}  // namespace strata
