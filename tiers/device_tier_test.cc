#include "tiers/device_tier.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
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


// The daemon's arena (daemon/device_arena.h): an emulated device on a shared
// memfd, whose slot offsets are offsets in that memfd, so another process
// mapping it reads what the tier wrote.
TEST(SharedEmulatedDeviceTest, SlotOffsetsAreOffsetsInTheExportedMemfd) {
  EmulatedDeviceOptions options;
  options.capacity_bytes = 1 << 20;
  options.shared_memory = true;
  auto device = EmulatedDevice::Create(options);
  ASSERT_TRUE(device.ok());
  auto tier = DeviceTier::Create(device->get(), {.capacity_bytes = 256 << 10});
  ASSERT_TRUE(tier.ok()) << tier.status();
  auto share = (*tier)->ExportArena();
  ASSERT_TRUE(share.ok()) << share.status();
  EXPECT_EQ(share->kind, DeviceExport::Kind::kMemfd);
  EXPECT_EQ(share->offset, 0u);
  EXPECT_EQ(share->bytes, 256u << 10);
  ASSERT_GE(share->memfd, 0);
  // A second mapping of the descriptor, as a trainer makes it.
  void* view = mmap(nullptr, share->bytes, PROT_READ, MAP_SHARED, share->memfd, 0);
  ASSERT_NE(view, MAP_FAILED);
  const auto* bytes = static_cast<const std::byte*>(view);
  std::vector<TierSlot> slots;
  for (uint32_t i = 0; i < 3; ++i) {
    auto slot = (*tier)->Allocate(Key(i), 5000 + i);
    ASSERT_TRUE(slot.ok());
    std::vector<std::byte> data(slot->size_bytes, std::byte(0x10 + i));
    ASSERT_TRUE((*tier)->Write(*slot, data).ok());
    slots.push_back(*slot);
  }
  for (uint32_t i = 0; i < 3; ++i) {
    std::vector<std::byte> want(slots[i].size_bytes, std::byte(0x10 + i));
    EXPECT_EQ(std::memcmp(bytes + slots[i].offset_bytes, want.data(), want.size()), 0) << i;
  }
  munmap(view, share->bytes);
}

TEST(SharedEmulatedDeviceTest, HeapMemoryCannotBeExported) {
  EmulatedDeviceOptions options;
  options.capacity_bytes = 1 << 20;
  auto device = EmulatedDevice::Create(options);
  ASSERT_TRUE(device.ok());
  auto buffer = (*device)->Allocate(4096);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ((*device)->Export(*buffer).status().code(), absl::StatusCode::kUnimplemented);
  options.shared_memory = true;
  auto shared = EmulatedDevice::Create(options);
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ((*shared)->Export(DeviceBuffer{42, 4096}).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
