#include "tiers/nvme_tier.h"

#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "swap/io_engine.h"
#include "swap/testing/scratch_extent_store.h"
#include "tiers/testing/store_world.h"
#include "tiers/tiered_store.h"

namespace strata {
namespace {

class NvmeTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto scratch = ScratchExtentStore::Create("nvme_tier", 8 << 20);
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    extents_ = scratch_->store();
    auto tier = NvmeTier::Create(extents_, {.capacity_bytes = 4 << 20});
    ASSERT_TRUE(tier.ok()) << tier.status();
    tier_ = std::move(*tier);
  }
  std::unique_ptr<ScratchExtentStore> scratch_;
  ExtentStore* extents_ = nullptr;  // scratch_'s
  std::unique_ptr<NvmeTier> tier_;
};

TEST_F(NvmeTierTest, WriteReadAndFreeGoThroughTheExtentStore) {
  auto slot = tier_->Allocate(TestKey(1), 100000);
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ(slot->footprint_bytes, 128u << 10);
  const uint64_t align = tier_->host_buffer_alignment();
  std::vector<std::byte> buffer(200000 + align);
  std::byte* aligned = reinterpret_cast<std::byte*>(
      (reinterpret_cast<uintptr_t>(buffer.data()) + align - 1) / align * align);
  std::fill(aligned, aligned + 100000, std::byte{0x6d});
  ASSERT_TRUE(tier_->Write(*slot, absl::MakeConstSpan(aligned, 100000)).ok());
  EXPECT_TRUE(extents_->Contains(TestKey(1)));
  std::fill(aligned, aligned + 100000, std::byte{0});
  ASSERT_TRUE(tier_->Read(*slot, absl::MakeSpan(aligned, 100000)).ok());
  EXPECT_EQ(aligned[99999], std::byte{0x6d});
  tier_->Free(*slot);
  EXPECT_FALSE(extents_->Contains(TestKey(1)));
  EXPECT_EQ(tier_->used_bytes(), 0u);
}

TEST_F(NvmeTierTest, CapacityIsEnforcedAtAllocate) {
  auto a = tier_->Allocate(TestKey(1), 3 << 20);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(tier_->Allocate(TestKey(2), 2 << 20).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(NvmeTierTest, StoreMovesShardsBetweenNvmeHomeAndTheDeviceTier) {
  auto device = EmulatedDevice::Create({.capacity_bytes = 256 << 10});
  ASSERT_TRUE(device.ok());
  auto device_tier = DeviceTier::Create(device->get(), {.capacity_bytes = 256 << 10});
  ASSERT_TRUE(device_tier.ok());
  FakeClock clock;
  InlineExecutor executor;
  auto store = TieredStore::Create({device_tier->get(), tier_.get()},
                                   {.clock = &clock, .executor = &executor});
  ASSERT_TRUE(store.ok());
  constexpr size_t kShard = 100 << 10;  // unaligned size, unaligned source buffers
  for (uint32_t t = 1; t <= 3; ++t) {
    ASSERT_TRUE((*store)->AddShard(TestKey(t), TierKind::kNvme, Filled(kShard, t)).ok());
  }
  // Device holds 2; writing 1 and evicting it writes it back to NVMe.
  auto lease = (*store)->Acquire(TestKey(1), TierKind::kDevice, AccessMode::kWrite);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE((*store)->WriteShard(*lease, Filled(kShard, 0x99)).ok());
  ASSERT_TRUE((*store)->Release(lease->id, true).ok());
  for (uint32_t t = 2; t <= 3; ++t) {
    auto l = (*store)->Acquire(TestKey(t), TierKind::kDevice, AccessMode::kRead);
    ASSERT_TRUE(l.ok()) << l.status();
    std::vector<std::byte> out(kShard);
    ASSERT_TRUE((*store)->ReadShard(*l, absl::MakeSpan(out)).ok());
    EXPECT_EQ(out, Filled(kShard, t));
    ASSERT_TRUE((*store)->Release(l->id, false).ok());
  }
  EXPECT_EQ((*store)->stats().tier(TierKind::kDevice).write_backs, 1u);
  auto home = (*store)->Acquire(TestKey(1), TierKind::kNvme, AccessMode::kRead);
  ASSERT_TRUE(home.ok());
  std::vector<std::byte> out(kShard);
  ASSERT_TRUE((*store)->ReadShard(*home, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, Filled(kShard, 0x99));
  ASSERT_TRUE((*store)->Release(home->id, false).ok());
  ASSERT_TRUE((*store)->CheckInvariants().ok()) << (*store)->CheckInvariants();
}

}  // namespace
}  // namespace strata
