#include "core/zero_partition.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

PartitionSpec RandomSpec(std::mt19937_64& rng, int stage, uint32_t world) {
  PartitionSpec spec;
  spec.stage = stage;
  spec.world_size = world;
  std::uniform_int_distribution<int> count(1, 12);
  // Mix tiny tensors (biases) with large ones (weight matrices).
  std::uniform_int_distribution<int> small(1, 3000);
  std::uniform_int_distribution<int> large(1, 300000);
  int n = count(rng);
  for (int i = 0; i < n; ++i) {
    uint64_t numel = (rng() % 2) ? small(rng) : large(rng);
    spec.tensors.push_back(TensorSpec{TensorId(100 + i), "t" + std::to_string(i), numel});
  }
  return spec;
}

// Every element of every tensor is owned by exactly one rank when the state is
// partitioned, and by every rank when it is replicated; shards are aligned.
TEST(ZeroPartitionTest, EveryElementOwnedExactlyOnceAcrossRandomModels) {
  std::mt19937_64 rng(301);
  for (uint32_t world = 1; world <= 64; ++world) {
    for (int stage = 0; stage <= 3; ++stage) {
      PartitionSpec spec = RandomSpec(rng, stage, world);
      for (StateClass state :
           {StateClass::kParams, StateClass::kGrads, StateClass::kOptimizerStates}) {
        auto layouts = PartitionState(spec, state);
        ASSERT_TRUE(layouts.ok()) << layouts.status();
        ASSERT_EQ(layouts->size(), world);
        const bool partitioned = IsPartitioned(stage, state);
        std::vector<std::vector<uint8_t>> owners;
        for (const TensorSpec& t : spec.tensors) owners.emplace_back(t.numel, 0);
        const uint64_t align = AlignmentElements(spec.alignment_bytes);
        for (const RankLayout& rank : *layouts) {
          ASSERT_EQ(rank.shards.size(), (*layouts)[0].shards.size());
          for (size_t s = 0; s < rank.shards.size(); ++s) {
            const ShardLayout& shard = rank.shards[s];
            // Same padded size on every rank; O_DIRECT-aligned in any dtype.
            EXPECT_EQ(shard.padded_numel, (*layouts)[0].shards[s].padded_numel);
            EXPECT_EQ(shard.padded_numel % align, 0u);
            EXPECT_LE(shard.OwnedNumel(), shard.padded_numel);
            uint64_t cursor = 0;
            for (const OwnedRange& r : shard.ranges) {
              EXPECT_GE(r.shard_offset, cursor);
              cursor = r.shard_offset + r.numel;
              EXPECT_LE(cursor, shard.padded_numel);
              size_t t = r.tensor.value() - 100;
              for (uint64_t e = 0; e < r.numel; ++e) ++owners[t][r.tensor_offset + e];
            }
          }
        }
        const uint8_t expected = partitioned ? 1 : static_cast<uint8_t>(world);
        for (size_t t = 0; t < owners.size(); ++t) {
          for (uint64_t e = 0; e < owners[t].size(); ++e) {
            ASSERT_EQ(owners[t][e], expected)
                << "stage " << stage << " world " << world << " tensor " << t << " element " << e;
          }
        }
        if (partitioned) {
          // Owned counts differ only by padding: each rank's shortfall against
          // the padded size is at most one shard's padding (the last ranks').
          uint64_t total = 0;
          for (const TensorSpec& t : spec.tensors) total += t.numel;
          uint64_t padded = (*layouts)[0].PaddedNumel() * world;
          uint64_t owned = 0;
          for (const RankLayout& rank : *layouts) owned += rank.OwnedNumel();
          EXPECT_EQ(owned, total);
          EXPECT_GE(padded, total);
          uint64_t pieces = (*layouts)[0].shards.size();
          EXPECT_LT(padded - total, pieces * world * align);
        }
      }
    }
  }
}

TEST(ZeroPartitionTest, StagesPartitionWhatDeepSpeedPartitions) {
  EXPECT_FALSE(IsPartitioned(0, StateClass::kOptimizerStates));
  EXPECT_TRUE(IsPartitioned(1, StateClass::kOptimizerStates));
  EXPECT_FALSE(IsPartitioned(1, StateClass::kGrads));
  EXPECT_TRUE(IsPartitioned(2, StateClass::kGrads));
  EXPECT_FALSE(IsPartitioned(2, StateClass::kParams));
  EXPECT_TRUE(IsPartitioned(3, StateClass::kParams));
}

TEST(ZeroPartitionTest, FlatLayoutCutsAcrossTensorBoundaries) {
  PartitionSpec spec;
  spec.stage = 2;
  spec.world_size = 2;
  spec.alignment_bytes = 8;  // 4 elements
  spec.tensors = {{TensorId(1), "a", 5}, {TensorId(2), "b", 6}};
  auto layouts = PartitionState(spec, StateClass::kGrads);
  ASSERT_TRUE(layouts.ok());
  // 11 elements, 2 ranks, step 8 -> 8 per rank: rank 0 gets a[0..5) b[0..3).
  const ShardLayout& r0 = (*layouts)[0].shards[0];
  EXPECT_EQ(r0.padded_numel, 8u);
  ASSERT_EQ(r0.ranges.size(), 2u);
  EXPECT_EQ(r0.ranges[1].tensor, TensorId(2));
  EXPECT_EQ(r0.ranges[1].numel, 3u);
  const ShardLayout& r1 = (*layouts)[1].shards[0];
  ASSERT_EQ(r1.ranges.size(), 1u);
  EXPECT_EQ(r1.ranges[0].tensor_offset, 3u);
  EXPECT_EQ(r1.ranges[0].numel, 3u);
}

TEST(ZeroPartitionTest, RejectsBadSpecsNamingTheField) {
  PartitionSpec spec;
  spec.stage = 4;
  spec.tensors = {{TensorId(1), "a", 5}};
  EXPECT_NE(ValidatePartitionSpec(spec).message().find("stage 4"), std::string::npos);
  spec.stage = 1;
  spec.world_size = 0;
  EXPECT_NE(ValidatePartitionSpec(spec).message().find("world_size"), std::string::npos);
  spec.world_size = 2;
  spec.tensors.push_back({TensorId(1), "dup", 3});
  EXPECT_NE(ValidatePartitionSpec(spec).message().find("twice"), std::string::npos);
}

}  // namespace
}  // namespace strata
