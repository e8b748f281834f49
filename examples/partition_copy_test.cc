#include "examples/partition_copy.h"

#include <vector>

#include "core/zero_partition.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

std::vector<ModelTensor> Tensors() {
  return {{"a", 5000, 0}, {"b", 10, 5000}, {"c", 3000, 5010}};
}

PartitionSpec Spec(int stage, uint32_t world) {
  PartitionSpec spec;
  spec.stage = stage;
  spec.world_size = world;
  std::vector<ModelTensor> tensors = Tensors();
  for (uint32_t i = 0; i < tensors.size(); ++i) {
    spec.tensors.push_back({TensorId(i), tensors[i].name, tensors[i].numel});
  }
  return spec;
}

class PartitionCopyTest : public ::testing::TestWithParam<int> {};

// Scatter a flat buffer into every rank's shards and gather it back: each
// element comes back once, and padding is zero.
TEST_P(PartitionCopyTest, ShardsOfAllRanksRoundTripTheFlatBuffer) {
  const std::vector<ModelTensor> tensors = Tensors();
  const uint64_t numel = 8010;
  std::vector<float> flat(numel);
  for (uint64_t i = 0; i < numel; ++i) flat[i] = static_cast<float>(i) + 0.5f;

  auto layouts = PartitionState(Spec(GetParam(), 3), StateClass::kGrads);
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  std::vector<float> back(numel, -1.0f);
  for (const RankLayout& rank : *layouts) {
    for (const ShardLayout& shard : rank.shards) {
      ASSERT_TRUE(ValidateShardRanges(shard.index, shard.padded_numel, shard.ranges, tensors).ok());
      std::vector<float> slot(shard.padded_numel, 99.0f);
      CopyFlatToShard(flat, shard.ranges, tensors, absl::MakeSpan(slot));
      uint64_t nonzero = 0;
      for (float v : slot) nonzero += v != 0.0f;
      EXPECT_EQ(nonzero, shard.OwnedNumel());  // padding was zeroed
      CopyShardToFlat(slot, shard.ranges, tensors, absl::MakeSpan(back));
      for (const FlatRun& run : FlatRunsOf(shard.ranges, tensors)) {
        EXPECT_LE(run.offset + run.numel, numel);
      }
    }
  }
  EXPECT_EQ(back, flat);
}

INSTANTIATE_TEST_SUITE_P(Stages, PartitionCopyTest, ::testing::Values(2, 3));

TEST(ValidateShardRangesTest, RejectsRangesThatDoNotFit) {
  const std::vector<ModelTensor> tensors = Tensors();
  EXPECT_FALSE(ValidateShardRanges(0, 100, {{OwnedRange{TensorId(3), 0, 1, 0}}}, tensors).ok());
  EXPECT_FALSE(ValidateShardRanges(0, 100, {{OwnedRange{TensorId(1), 5, 6, 0}}}, tensors).ok());
  EXPECT_FALSE(ValidateShardRanges(0, 100, {{OwnedRange{TensorId(0), 0, 50, 60}}}, tensors).ok());
  EXPECT_FALSE(ValidateShardRanges(
                   0, 100, {{OwnedRange{TensorId(0), 0, 50, 0}, OwnedRange{TensorId(1), 0, 10, 45}}},
                   tensors)
                   .ok());
  EXPECT_TRUE(ValidateShardRanges(
                  0, 100, {{OwnedRange{TensorId(0), 0, 50, 0}, OwnedRange{TensorId(1), 0, 10, 50}}},
                  tensors)
                  .ok());
}

}  // namespace
}  // namespace strata
