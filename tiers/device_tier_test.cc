#include "tiers/device_tier.h"

#include <vector>

#include "gtest/gtest.h"
#include "tiers/emulated_device.h"

namespace strata {
namespace {

ShardKey Key(uint32_t tensor) { return ShardKey{JobId(1), Rank(0), TensorId(tensor)}; }

class DeviceTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EmulatedDeviceOptions options;
    options.capacity_bytes = 2 << 20;
    auto device = EmulatedDevice::Create(options);
    ASSERT_TRUE(device.ok());
    device_ = std::move(*device);
    auto tier = DeviceTier::Create(device_.get(), {.capacity_bytes = 1 << 20});
    ASSERT_TRUE(tier.ok()) << tier.status();
    tier_ = std::move(*tier);
  }
  std::unique_ptr<EmulatedDevice> device_;
  std::unique_ptr<DeviceTier> tier_;
};

TEST_F(DeviceTierTest, TakesItsArenaFromTheDeviceOnce) {
  EXPECT_EQ(device_->allocated_bytes(), 1u << 20);
  auto slot = tier_->Allocate(Key(1), 5000);
  ASSERT_TRUE(slot.ok());
  EXPECT_EQ(slot->footprint_bytes, 8192u);
  EXPECT_EQ(tier_->used_bytes(), 8192u);
  EXPECT_EQ(device_->allocated_bytes(), 1u << 20);
}

TEST_F(DeviceTierTest, WriteThenReadReturnsTheBytes) {
  auto slot = tier_->Allocate(Key(1), 5000);
  ASSERT_TRUE(slot.ok());
  std::vector<std::byte> in(5000, std::byte{0x5a}), out(5000);
  ASSERT_TRUE(tier_->Write(*slot, in).ok());
  ASSERT_TRUE(tier_->Read(*slot, absl::MakeSpan(out)).ok());
  EXPECT_EQ(in, out);
  EXPECT_TRUE(tier_->HostView(*slot).empty());
}

TEST_F(DeviceTierTest, FullTierIsResourceExhaustedNamingTheShard) {
  auto big = tier_->Allocate(Key(1), 1 << 20);
  ASSERT_TRUE(big.ok());
  auto more = tier_->Allocate(Key(2), 1);
  ASSERT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(more.status().message().find("job1/rank0/t2"), std::string::npos) << more.status();
  tier_->Free(*big);
  EXPECT_TRUE(tier_->Allocate(Key(2), 1).ok());
}

TEST_F(DeviceTierTest, ArenaLargerThanTheDeviceFails) {
  auto tier = DeviceTier::Create(device_.get(), {.capacity_bytes = 2 << 20});
  EXPECT_EQ(tier.status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace strata
