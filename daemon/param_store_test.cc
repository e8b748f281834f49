// The daemon's one param store seen from jobs (ParamCache over ParamStore):
// shards served from the device tier bit for bit, a device budget smaller
// than the params (eviction), parking a job in NVMe and resuming it, the
// errors, and two jobs sharing the window tier.
#include "daemon/param_store.h"

#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "daemon/param_cache.h"
#include "gtest/gtest.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"
#include "swap/testing/scratch_extent_store.h"
#include "tiers/device_tier.h"
#include "tiers/emulated_device.h"
#include "tiers/pinned_arena.h"

namespace strata {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kSlot = 4 * kPage;
constexpr uint32_t kShards = 6;
const absl::Duration kWait = absl::Seconds(20);

std::vector<std::byte> Pattern(uint64_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(bytes);
  for (std::byte& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// One job's rank-0 window of kShards slots.
struct Window {
  PinnedArena arena;
  static Window Make(const std::string& name) {
    PinnedArenaOptions o;
    o.name = name;
    o.size_bytes = kShards * kSlot;
    o.huge_pages = false;
    o.populate = false;
    o.lock = MemoryLockMode::kOff;
    auto arena = PinnedArena::Create(o);
    EXPECT_TRUE(arena.ok()) << arena.status();
    return Window{std::move(*arena)};
  }
  std::byte* slot(uint32_t i) { return arena.data() + i * kSlot; }
};

class ParamStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto scratch = ScratchExtentStore::Create("param_store", 16 << 20);
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    nvme_ = scratch_->store();
    EmulatedDeviceOptions device_options;
    device_options.capacity_bytes = 16 * kSlot;
    auto device = EmulatedDevice::Create(device_options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    DeviceTierOptions tier_options;
    tier_options.capacity_bytes = 16 * kSlot;
    auto tier = DeviceTier::Create(device_.get(), tier_options);
    ASSERT_TRUE(tier.ok()) << tier.status();
    device_tier_ = std::move(*tier);
  }

  std::unique_ptr<ParamStore> MakeStore(bool with_device, uint64_t pinned_capacity = 0) {
    ParamStoreOptions options;
    options.pinned_capacity_bytes = pinned_capacity;
    options.io_threads = 2;
    auto ps = ParamStore::Create(nvme_, with_device ? device_tier_.get() : nullptr, options);
    EXPECT_TRUE(ps.ok()) << ps.status();
    return std::move(*ps);
  }

  std::unique_ptr<ParamCache> MakeCache(ParamStore* ps, uint64_t job, Window* w, uint64_t budget) {
    return std::make_unique<ParamCache>(
        job, 1, ps,
        [w](uint32_t, uint32_t index) {
          return ParamCache::ShardRef{w->slot(index), kSlot, index * kSlot};
        },
        budget, /*lookahead=*/2, [w](uint32_t, uint32_t index) { (void)w->arena.Discard(index * kSlot, kSlot); });
  }

  // The trainer writes every slot and InitParams sends each home.
  static void StoreAll(ParamCache& cache, Window& w, uint32_t seed) {
    for (uint32_t i = 0; i < kShards; ++i) {
      const std::vector<std::byte> p = Pattern(kSlot, seed + i);
      std::memcpy(w.slot(i), p.data(), kSlot);
      ASSERT_TRUE(cache.StoreHome(0, i).ok());
    }
  }

  // The device copy of shard `i` of `job`, read back through the store.
  std::vector<std::byte> DeviceBytes(ParamStore* ps, uint64_t job, uint32_t i) {
    const ShardKey key{JobId(job), Rank(0), TensorId(i), TensorKind::kParam16, 0};
    auto lease = ps->store()->Acquire(key, TierKind::kDevice, AccessMode::kRead);
    EXPECT_TRUE(lease.ok()) << lease.status();
    std::vector<std::byte> out(kSlot);
    EXPECT_TRUE(ps->store()->ReadShard(*lease, absl::MakeSpan(out)).ok());
    EXPECT_TRUE(ps->store()->Release(lease->id, false).ok());
    return out;
  }

  std::unique_ptr<ScratchExtentStore> scratch_;
  ExtentStore* nvme_ = nullptr;  // scratch_'s
  std::unique_ptr<EmulatedDevice> device_;
  std::unique_ptr<DeviceTier> device_tier_;
};

TEST_F(ParamStoreTest, DeviceAcquireIsBitExactAndABudgetSmallerThanTheParamsStillServesEveryShard) {
  auto ps = MakeStore(true);
  Window w = Window::Make("strata-test-ps-device");
  auto cache = MakeCache(ps.get(), 11, &w, 2 * kSlot);
  StoreAll(*cache, w, 100);
  ASSERT_TRUE(cache->SetDeviceBudget(2 * kSlot).ok());
  // Three iterations over all shards, one at a time, as a forward pass would.
  for (int iteration = 0; iteration < 3; ++iteration) {
    for (uint32_t i = 0; i < kShards; ++i) {
      auto offsets = cache->AcquireDevice(0, {i}, absl::Now() + kWait);
      ASSERT_TRUE(offsets.ok()) << offsets.status();
      ASSERT_EQ(offsets->size(), 1u);
      EXPECT_EQ((*offsets)[0] % kPage, 0u);
      EXPECT_LT((*offsets)[0], 16 * kSlot);
      ASSERT_EQ(DeviceBytes(ps.get(), 11, i), Pattern(kSlot, 100 + i)) << "shard " << i;
      ASSERT_TRUE(cache->Release(0, {i}).ok());
      EXPECT_LE(ps->store()->job_charged_bytes(JobId(11), TierKind::kDevice), 2 * kSlot);
      EXPECT_LE(*w.arena.ResidentBytes(), 2 * kSlot);
    }
    cache->IterationBoundary(0);
  }
  EXPECT_GT(ps->store()->job_stats(JobId(11)).tier(TierKind::kDevice).evictions, 0u);
  EXPECT_TRUE(ps->store()->CheckInvariants().ok()) << ps->store()->CheckInvariants();
  // A new version (the optimizer step) replaces the device copy.
  cache->BeginUpdate();
  const std::vector<std::byte> next = Pattern(kSlot, 999);
  std::memcpy(w.slot(4), next.data(), kSlot);
  ASSERT_TRUE(cache->StoreHome(0, 4).ok());
  cache->EndUpdate();
  ASSERT_TRUE(cache->AcquireDevice(0, {4}, absl::Now() + kWait).ok());
  EXPECT_EQ(DeviceBytes(ps.get(), 11, 4), next);
  ASSERT_TRUE(cache->Release(0, {4}).ok());
}

TEST_F(ParamStoreTest, DeviceAcquireErrorsNameTheFix) {
  {
    auto ps = MakeStore(false);
    Window w = Window::Make("strata-test-ps-nodevice");
    auto cache = MakeCache(ps.get(), 12, &w, 2 * kSlot);
    StoreAll(*cache, w, 200);
    auto got = cache->AcquireDevice(0, {0}, absl::Now() + kWait);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(got.status().message().find("--device"), std::string::npos) << got.status();
  }
  auto ps = MakeStore(true);
  Window w = Window::Make("strata-test-ps-nobudget");
  auto cache = MakeCache(ps.get(), 13, &w, 4 * kSlot);
  StoreAll(*cache, w, 300);
  auto got = cache->AcquireDevice(0, {0}, absl::Now() + kWait);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(got.status().message().find("device_budget_bytes"), std::string::npos) << got.status();
  // Pinned shards alone over the budget: refused with the numbers.
  ASSERT_TRUE(cache->SetDeviceBudget(2 * kSlot).ok());
  got = cache->AcquireDevice(0, {0, 1, 2}, absl::Now() + kWait);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
  EXPECT_NE(got.status().message().find("KiB"), std::string::npos) << got.status();
  // Nothing stays pinned after the refusal.
  auto third = cache->AcquireDevice(0, {3}, absl::Now() + kWait);
  ASSERT_TRUE(third.ok()) << third.status();
  ASSERT_TRUE(cache->Release(0, {3}).ok());
  EXPECT_EQ(cache->Release(0, {3}).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ParamStoreTest, ParkToNvmeFreesWindowAndDeviceAndResumeBringsThemBack) {
  auto ps = MakeStore(true);
  Window w = Window::Make("strata-test-ps-park");
  auto cache = MakeCache(ps.get(), 14, &w, 4 * kSlot);
  StoreAll(*cache, w, 400);
  ASSERT_TRUE(cache->SetDeviceBudget(3 * kSlot).ok());
  for (uint32_t i : {0u, 1u, 2u}) {
    ASSERT_TRUE(cache->AcquireDevice(0, {i}, absl::Now() + kWait).ok());
  }
  // Refused while the trainer holds shards.
  auto refused = cache->Park(TierKind::kNvme);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("rank 0"), std::string::npos) << refused.status();
  ASSERT_TRUE(cache->Release(0, {0, 1, 2}).ok());
  const uint64_t window_before = cache->resident_bytes();
  const uint64_t device_before = ps->store()->job_charged_bytes(JobId(14), TierKind::kDevice);
  ASSERT_GT(window_before, 0u);
  ASSERT_EQ(device_before, 3 * kSlot);
  auto parked = cache->Park(TierKind::kNvme);
  ASSERT_TRUE(parked.ok()) << parked.status();
  EXPECT_GE(parked->shards, 3u);
  EXPECT_EQ(cache->resident_bytes(), 0u);
  EXPECT_EQ(*w.arena.ResidentBytes(), 0u);  // the window's pages went back
  EXPECT_EQ(ps->store()->job_charged_bytes(JobId(14), TierKind::kDevice), 0u);
  EXPECT_EQ(device_tier_->used_bytes(), 0u);
  auto resumed = cache->Resume();
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(cache->resident_bytes(), window_before);
  EXPECT_EQ(ps->store()->job_charged_bytes(JobId(14), TierKind::kDevice), device_before);
  EXPECT_GE(resumed->bytes_moved, device_before);
  for (uint32_t i : {0u, 1u, 2u}) {
    EXPECT_TRUE(ps->store()->IsResident(ShardKey{JobId(14), Rank(0), TensorId(i), TensorKind::kParam16, 0},
                                        TierKind::kDevice));
    EXPECT_EQ(DeviceBytes(ps.get(), 14, i), Pattern(kSlot, 400 + i)) << "shard " << i;
  }
  // Parking in the window keeps the window's copies and drops the device's.
  auto to_window = cache->Park(TierKind::kPinnedHost);
  ASSERT_TRUE(to_window.ok()) << to_window.status();
  EXPECT_EQ(device_tier_->used_bytes(), 0u);
  EXPECT_GT(cache->resident_bytes(), 0u);
  EXPECT_EQ(cache->Park(TierKind::kDevice).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ps->store()->CheckInvariants().ok()) << ps->store()->CheckInvariants();
}

TEST_F(ParamStoreTest, TwoJobsShareTheWindowTierAndAJobEvictsItsOwnFirst) {
  // Room for 5 slots in the whole pinned tier: job A keeps 3, job B gets 2
  // more and then, needing a third, drops one of its own, not A's.
  auto ps = MakeStore(false, 5 * kSlot);
  Window wa = Window::Make("strata-test-ps-a");
  Window wb = Window::Make("strata-test-ps-b");
  auto a = MakeCache(ps.get(), 21, &wa, 3 * kSlot);
  auto b = MakeCache(ps.get(), 22, &wb, 3 * kSlot);
  StoreAll(*a, wa, 500);
  EXPECT_EQ(a->resident_bytes(), 3 * kSlot);
  for (uint32_t i = 0; i < kShards; ++i) {
    const std::vector<std::byte> p = Pattern(kSlot, 600 + i);
    std::memcpy(wb.slot(i), p.data(), kSlot);
    ASSERT_TRUE(b->StoreHome(0, i).ok()) << i;
    EXPECT_EQ(a->resident_bytes(), 3 * kSlot) << i;
  }
  EXPECT_EQ(b->resident_bytes(), 2 * kSlot);
  for (uint32_t i = 0; i < kShards; ++i) {
    ASSERT_TRUE(b->Acquire(0, {i}, absl::Now() + kWait).ok());
    ASSERT_EQ(std::memcmp(wb.slot(i), Pattern(kSlot, 600 + i).data(), kSlot), 0) << i;
    ASSERT_TRUE(b->Release(0, {i}).ok());
  }
  EXPECT_EQ(a->resident_bytes(), 3 * kSlot);
  // Per-job counters: B's misses are B's.
  EXPECT_GT(b->stats().misses + b->stats().hits, 0u);
  EXPECT_EQ(a->stats().misses, 0u);
  // A job's slots leave the shared store with it.
  a.reset();
  EXPECT_EQ(ps->store()->job_charged_bytes(JobId(21), TierKind::kPinnedHost), 0u);
  EXPECT_TRUE(ps->store()->CheckInvariants().ok()) << ps->store()->CheckInvariants();
}

}  // namespace
}  // namespace strata
