// TieredStore::WriteHome: new bytes for a whole shard go to its home from the
// caller's buffer, and no stale cached copy survives them.
#include <vector>

#include "gtest/gtest.h"
#include "tiers/testing/store_world.h"
#include "tiers/tiered_store.h"

namespace strata {
namespace {

constexpr size_t kShard = 64 << 10;
constexpr TierKind kDev = TierKind::kDevice;
constexpr TierKind kHome = TierKind::kPinnedHost;

class WriteHomeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto world = StoreWorld::Create();
    ASSERT_TRUE(world.ok()) << world.status();
    world_ = std::move(*world);
    ASSERT_TRUE(store().AddShard(TestKey(1), kHome, Filled(kShard, 1)).ok());
  }
  TieredStore& store() { return *world_->store; }
  std::vector<std::byte> ReadVia(TierKind tier) {
    auto lease = store().Acquire(TestKey(1), tier, AccessMode::kRead);
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return {};
    std::vector<std::byte> out(kShard);
    EXPECT_TRUE(store().ReadShard(*lease, absl::MakeSpan(out)).ok());
    EXPECT_TRUE(store().Release(lease->id, false).ok());
    return out;
  }
  void ExpectInvariants() {
    absl::Status s = store().CheckInvariants();
    EXPECT_TRUE(s.ok()) << s;
  }
  std::unique_ptr<StoreWorld> world_;
};

TEST_F(WriteHomeTest, TheHomeTakesTheBytesAndTheCachedCopyGoes) {
  ASSERT_EQ(ReadVia(kDev), Filled(kShard, 1));  // a clean cached copy
  ASSERT_TRUE(store().IsResident(TestKey(1), kDev));
  const uint64_t in_before = store().job_stats(JobId(1)).tier(kHome).bytes_in;
  const std::vector<std::byte> fresh = Filled(kShard, 42);
  ASSERT_TRUE(store().WriteHome(TestKey(1), fresh).ok());
  EXPECT_FALSE(store().IsResident(TestKey(1), kDev));  // it would have been stale
  EXPECT_EQ(ReadVia(kHome), fresh);
  EXPECT_EQ(ReadVia(kDev), fresh);  // promoted anew from the home
  EXPECT_EQ(store().job_stats(JobId(1)).tier(kHome).bytes_in - in_before, kShard);
  ExpectInvariants();
}

TEST_F(WriteHomeTest, APinnedCopyRefusesAndNothingChanges) {
  auto lease = store().Acquire(TestKey(1), kDev, AccessMode::kRead);
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::Status s = store().WriteHome(TestKey(1), Filled(kShard, 9));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("pinned or moving"), std::string::npos) << s;
  std::vector<std::byte> seen(kShard);
  ASSERT_TRUE(store().ReadShard(*lease, absl::MakeSpan(seen)).ok());
  EXPECT_EQ(seen, Filled(kShard, 1));
  ASSERT_TRUE(store().Release(lease->id, false).ok());
  EXPECT_EQ(ReadVia(kHome), Filled(kShard, 1));
  ExpectInvariants();
}

TEST_F(WriteHomeTest, ADirtyCopyThatIsTheOnlyLatestRefusesUntilWrittenBack) {
  auto lease = store().AcquireForOverwrite(TestKey(1), kDev);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(store().WriteShard(*lease, Filled(kShard, 7)).ok());
  ASSERT_TRUE(store().Release(lease->id, /*dirty=*/true).ok());
  EXPECT_EQ(store().WriteHome(TestKey(1), Filled(kShard, 8)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadVia(kDev), Filled(kShard, 7));
  auto written = store().WriteBack(TestKey(1));
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_TRUE((*written)->Wait().ok());
  ASSERT_TRUE(store().WriteHome(TestKey(1), Filled(kShard, 8)).ok());
  EXPECT_EQ(ReadVia(kDev), Filled(kShard, 8));
  ExpectInvariants();
}

TEST_F(WriteHomeTest, AWrongSizeOrAnUnknownShardIsRefused) {
  EXPECT_EQ(store().WriteHome(TestKey(1), Filled(kShard - 1, 3)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store().WriteHome(TestKey(2), Filled(kShard, 3)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadVia(kHome), Filled(kShard, 1));
  ExpectInvariants();
}

}  // namespace
}  // namespace strata
