// NvmeShardStateStore's streaming pass (UpdateStream): the shards come from
// a source while the pass runs -- some at once, some only after the pass
// asked and waited -- and every tile of every shard is visited once, in
// order, and saved; a preload is this pass's first load when the pass starts
// with its tiles and is waited out when it does not. The store streams 1024-
// element tiles over a scratch extent store.
#include "daemon/nvme_shard_state_store.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "swap/testing/scratch_extent_store.h"

namespace strata {
namespace {

constexpr uint64_t kTile = 1024;  // elements per state tile
constexpr uint32_t kShards = 4;

// Odd shards have 2.5 tiles of elements (the last tile short), even shards half a tile.
uint64_t Numel(uint32_t i) { return i % 2 == 1 ? 2 * kTile + kTile / 2 : kTile / 2; }

class NvmeShardStateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto scratch = ScratchExtentStore::Create("nvme_shard_state_store", 64 << 20);
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    StateLayout layout;
    layout.exp_avg = true;
    auto store = NvmeShardStateStore::Create(7, layout, scratch_->store(), kTile * 4);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    for (uint32_t i = 0; i < kShards; ++i) ASSERT_TRUE(store_->Create(0, i, Numel(i)).ok());
  }

  // Adds `shard * 1000 + offset + e` to every master element and 1 to every
  // exp_avg, recording the tiles visited.
  TileFn AddFn(std::vector<std::pair<uint32_t, uint64_t>>* visited) {
    return [visited](const ShardId& id, const StateTile& tile) {
      visited->emplace_back(id.index, tile.offset);
      for (uint64_t e = 0; e < tile.size; ++e) {
        tile.master[e] += static_cast<float>(id.index * 1000 + tile.offset + e);
        tile.exp_avg[e] += 1;
      }
      return absl::OkStatus();
    };
  }

  // Every element of `shard` holds `times` of what AddFn adds.
  void ExpectAdded(uint32_t shard, int times) {
    const std::vector<ShardId> one = {ShardId{0, shard}};
    uint64_t seen = 0;
    ASSERT_TRUE(store_
                    ->Read(one,
                           [&](const ShardId&, const StateTile& tile) {
                             for (uint64_t e = 0; e < tile.size; ++e) {
                               const float want = static_cast<float>(times * (shard * 1000 + tile.offset + e));
                               if (tile.master[e] != want || tile.exp_avg[e] != static_cast<float>(times)) {
                                 return absl::InternalError(absl::StrCat("shard ", shard, " element ",
                                                                         tile.offset + e, ": ", tile.master[e]));
                               }
                             }
                             seen += tile.size;
                             return absl::OkStatus();
                           })
                    .ok());
    EXPECT_EQ(seen, Numel(shard));
  }

  static std::vector<std::pair<uint32_t, uint64_t>> TilesInOrder(const std::vector<uint32_t>& shards) {
    std::vector<std::pair<uint32_t, uint64_t>> tiles;
    for (uint32_t s : shards) {
      for (uint64_t off = 0; off < Numel(s); off += kTile) tiles.emplace_back(s, off);
    }
    return tiles;
  }

  std::unique_ptr<ScratchExtentStore> scratch_;
  std::unique_ptr<NvmeShardStateStore> store_;
};

TEST_F(NvmeShardStateStoreTest, AStreamVisitsTheShardsItIsGivenWhileThePassRuns) {
  // Shard 3 is ready at once; 1 only when the pass waits; 2 is ready when
  // asked without waiting; 0 again only after a wait; then the stream ends.
  // A no-wait answer of "none yet" must not end the pass.
  std::vector<uint32_t> order = {3, 1, 2, 0};
  std::vector<bool> needs_wait = {false, true, false, true};
  size_t next = 0;
  int asked_without_wait = 0;
  ShardSource source = [&](bool wait) -> std::optional<ShardId> {
    if (!wait) ++asked_without_wait;
    if (next == order.size()) return std::nullopt;
    if (needs_wait[next] && !wait) return std::nullopt;
    return ShardId{0, order[next++]};
  };
  std::vector<std::pair<uint32_t, uint64_t>> visited;
  ASSERT_TRUE(store_->UpdateStream(source, AddFn(&visited)).ok());
  EXPECT_EQ(visited, TilesInOrder(order));
  EXPECT_GT(asked_without_wait, 0);
  for (uint32_t i = 0; i < kShards; ++i) ExpectAdded(i, 1);
}

TEST_F(NvmeShardStateStoreTest, APreloadIsTheStreamsFirstLoadOnlyWhenItStartsWithItsTiles) {
  std::vector<std::pair<uint32_t, uint64_t>> visited;
  // Preloaded: shards 1 and 2's first tiles; the stream starts with shard 1.
  store_->Preload({ShardId{0, 1}, ShardId{0, 2}});
  const std::vector<ShardId> same = {ShardId{0, 1}, ShardId{0, 2}};
  ASSERT_TRUE(store_->UpdateStream(ShardList(same), AddFn(&visited)).ok());
  // Preloaded shard 3; the stream starts with 0: the preload is waited out
  // and never used for shard 0's tiles.
  store_->Preload({ShardId{0, 3}});
  const std::vector<ShardId> other = {ShardId{0, 0}, ShardId{0, 3}};
  ASSERT_TRUE(store_->UpdateStream(ShardList(other), AddFn(&visited)).ok());
  // Preloaded 0, 2 and 3 (a tile each); the stream visits 0 and then 3: it
  // takes the first preload and waits the others out.
  store_->Preload({ShardId{0, 0}, ShardId{0, 2}, ShardId{0, 3}});
  ASSERT_TRUE(store_->UpdateStream(ShardList(other), AddFn(&visited)).ok());
  ExpectAdded(0, 2);
  ExpectAdded(1, 1);
  ExpectAdded(2, 1);
  ExpectAdded(3, 2);
  EXPECT_EQ(visited.size(), 3 + 1 + (1 + 3) * 2);
}

TEST_F(NvmeShardStateStoreTest, AnEmptyStreamAndAFailingTileChangeNothing) {
  std::vector<std::pair<uint32_t, uint64_t>> visited;
  ShardSource none = [](bool) -> std::optional<ShardId> { return std::nullopt; };
  ASSERT_TRUE(store_->UpdateStream(none, AddFn(&visited)).ok());
  EXPECT_TRUE(visited.empty());
  // The pass stops at the first error; what it had saved stays saved (the
  // job rolls an uncommitted pass back), and the next pass runs.
  const std::vector<ShardId> all = {ShardId{0, 0}, ShardId{0, 1}};
  int calls = 0;
  absl::Status failed = store_->UpdateStream(ShardList(all), [&](const ShardId&, const StateTile&) {
    return ++calls == 2 ? absl::DataLossError("tile two") : absl::OkStatus();
  });
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(calls, 2);
  visited.clear();
  ASSERT_TRUE(store_->UpdateStream(ShardList(all), AddFn(&visited)).ok());
  EXPECT_EQ(visited, TilesInOrder({0, 1}));
}

}  // namespace
}  // namespace strata
