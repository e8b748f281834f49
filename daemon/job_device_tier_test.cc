// JobDeviceTier: one arena per job, each shared alone, freed when its job
// and its last slot are gone.
#include "daemon/job_device_tier.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "tiers/emulated_device.h"

namespace strata {
namespace {

class JobDeviceTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    EmulatedDeviceOptions options;
    options.capacity_bytes = 1 << 20;
    options.shared_memory = true;
    auto device = EmulatedDevice::Create(options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    JobDeviceTierOptions tier_options;
    tier_options.capacity_bytes = 256 << 10;
    tier_options.arena_headroom = 1;  // arenas of exactly their budget; the daemon's headroom is tested below
    auto tier = JobDeviceTier::Create(device_.get(), tier_options);
    ASSERT_TRUE(tier.ok()) << tier.status();
    tier_ = std::move(*tier);
  }
  static ShardKey Key(uint64_t job, uint32_t index) {
    return ShardKey{JobId(job), Rank(0), TensorId(index), TensorKind::kParam16, 0};
  }
  std::unique_ptr<EmulatedDevice> device_;
  std::unique_ptr<JobDeviceTier> tier_;
};

TEST_F(JobDeviceTierTest, EachJobsShareIsItsOwnMemfdOfItsBudgetAndHoldsOnlyItsBytes) {
  auto a = tier_->OpenJob(JobId(1), 64 << 10);
  auto b = tier_->OpenJob(JobId(2), 96 << 10);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(tier_->arena_bytes(), 160u << 10);
  auto slot_a = tier_->Allocate(Key(1, 0), 8192);
  auto slot_b = tier_->Allocate(Key(2, 0), 8192);
  ASSERT_TRUE(slot_a.ok() && slot_b.ok());
  // Offsets are in each job's own arena: both start at 0.
  EXPECT_EQ(slot_a->offset_bytes, 0u);
  EXPECT_EQ(slot_b->offset_bytes, 0u);
  const std::vector<std::byte> ones(8192, std::byte{0x11}), twos(8192, std::byte{0x22});
  ASSERT_TRUE(tier_->Write(*slot_a, ones).ok());
  ASSERT_TRUE(tier_->Write(*slot_b, twos).ok());
  for (uint64_t job : {1, 2}) {
    auto share = tier_->Share(JobId(job));
    ASSERT_TRUE(share.ok()) << share.status();
    ASSERT_TRUE(share->read_only_fd.valid());
    const uint64_t budget = job == 1 ? 64 << 10 : 96 << 10;
    EXPECT_EQ(share->bytes, budget);
    struct stat st;
    ASSERT_EQ(fstat(share->read_only_fd.get(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), budget);  // nothing beyond the job's budget to map
    EXPECT_EQ(mmap(nullptr, budget, PROT_READ | PROT_WRITE, MAP_SHARED, share->read_only_fd.get(), 0), MAP_FAILED);
    void* map = mmap(nullptr, budget, PROT_READ, MAP_SHARED, share->read_only_fd.get(), 0);
    ASSERT_NE(map, MAP_FAILED);
    const auto* bytes = static_cast<const std::byte*>(map);
    const std::byte mine = job == 1 ? std::byte{0x11} : std::byte{0x22};
    const std::byte theirs = job == 1 ? std::byte{0x22} : std::byte{0x11};
    EXPECT_EQ(bytes[0], mine);
    uint64_t leaked = 0;
    for (uint64_t i = 0; i < budget; ++i) leaked += bytes[i] == theirs ? 1 : 0;
    EXPECT_EQ(leaked, 0u);
    munmap(map, budget);
  }
  tier_->Free(*slot_a);
  tier_->Free(*slot_b);
}

TEST_F(JobDeviceTierTest, TheBudgetIsTheArenaAndTheCapacityBoundsTheSum) {
  auto a = tier_->OpenJob(JobId(1), 16 << 10);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(tier_->Allocate(Key(1, 0), 8192).ok());
  ASSERT_TRUE(tier_->Allocate(Key(1, 1), 8192).ok());
  auto full = tier_->Allocate(Key(1, 2), 1);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted) << full.status();
  // A job with no arena gets no slot.
  EXPECT_EQ(tier_->Allocate(Key(9, 0), 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tier_->Share(JobId(9)).status().code(), absl::StatusCode::kNotFound);
  auto too_big = tier_->OpenJob(JobId(2), 241 << 10);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted) << too_big.status();
  EXPECT_TRUE(tier_->OpenJob(JobId(2), 240 << 10).ok());
  EXPECT_EQ(tier_->OpenJob(JobId(1), 8 << 10).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobDeviceTierTest, AnArenaIsFreedWhenItsJobAndItsLastSlotAreGone) {
  auto a = tier_->OpenJob(JobId(1), 64 << 10);
  ASSERT_TRUE(a.ok());
  auto slot = tier_->Allocate(Key(1, 0), 4096);
  ASSERT_TRUE(slot.ok());
  // A restored copy of the same job joins the arena.
  auto again = tier_->OpenJob(JobId(1), 64 << 10);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(tier_->arena_count(), 1u);
  a->reset();
  again->reset();
  // The store frees the job's last slot after the job: the arena waits for it,
  // no longer shared.
  EXPECT_EQ(tier_->arena_count(), 1u);
  EXPECT_EQ(tier_->Share(JobId(1)).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(tier_->Allocate(Key(1, 1), 1).status().code(), absl::StatusCode::kFailedPrecondition);
  tier_->Free(*slot);
  EXPECT_EQ(tier_->arena_count(), 0u);
  EXPECT_EQ(tier_->arena_bytes(), 0u);
  EXPECT_EQ(device_->allocated_bytes(), 0u);
  // The whole capacity is back.
  EXPECT_TRUE(tier_->OpenJob(JobId(3), 256 << 10).ok());
}

TEST(JobDeviceTierHeadroomTest, AnArenaIsTheHeadroomTimesItsBudgetAndAdmissionCountsBudgets) {
  EmulatedDeviceOptions options;
  options.capacity_bytes = 512 << 10;
  options.shared_memory = true;
  auto device = EmulatedDevice::Create(options);
  ASSERT_TRUE(device.ok());
  JobDeviceTierOptions tier_options;
  tier_options.capacity_bytes = 256 << 10;  // arena_headroom 2 by default
  auto tier = JobDeviceTier::Create(device->get(), tier_options);
  ASSERT_TRUE(tier.ok());
  auto a = (*tier)->OpenJob(JobId(1), 96 << 10);
  ASSERT_TRUE(a.ok()) << a.status();
  auto share = (*tier)->Share(JobId(1));
  ASSERT_TRUE(share.ok());
  EXPECT_EQ(share->bytes, 192u << 10);
  EXPECT_EQ((*tier)->budget_bytes(), 96u << 10);
  EXPECT_EQ((*tier)->arena_bytes(), 192u << 10);
  auto b = (*tier)->OpenJob(JobId(2), 160 << 10);  // the budgets fill the capacity; the arenas the device
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*tier)->OpenJob(JobId(3), 4 << 10).status().code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace strata
