// JobDeviceTier: one arena per job, each shared alone, freed when its job
// and its last slot are gone.
#include "daemon/job_device_tier.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "core/clock.h"
#include "gtest/gtest.h"
#include "tiers/emulated_device.h"
#include "tiers/pinned_host_tier.h"
#include "tiers/tiered_store.h"
#include "tiers/transfer_executor.h"

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

// Issue 30.4: a new job's arena holds none of a retired job's bytes, even one
// of the same size carved right after (another user's shards, otherwise).
// Emulated arenas are fresh memfds, zero from the start; CudaDevice zeroes
// each allocation (tiers/device_conformance_test.cc checks every device).
TEST_F(JobDeviceTierTest, ANewJobsArenaHoldsOnlyZerosAfterARetiredJobFilledItsOwn) {
  constexpr uint64_t kBudget = 64 << 10;
  constexpr uint64_t kSlot = 4096;
  {
    auto a = tier_->OpenJob(JobId(1), kBudget);
    ASSERT_TRUE(a.ok()) << a.status();
    std::vector<TierSlot> slots;
    const std::vector<std::byte> pattern(kSlot, std::byte{0xA5});
    for (uint32_t i = 0; i < kBudget / kSlot; ++i) {
      auto slot = tier_->Allocate(Key(1, i), kSlot);
      ASSERT_TRUE(slot.ok()) << slot.status();
      ASSERT_TRUE(tier_->Write(*slot, pattern).ok());
      slots.push_back(*slot);
    }
    for (const TierSlot& slot : slots) tier_->Free(slot);
  }  // job 1 retired: its lease and its last slot are gone
  ASSERT_EQ(tier_->arena_count(), 0u);
  ASSERT_EQ(device_->allocated_bytes(), 0u);

  auto b = tier_->OpenJob(JobId(2), kBudget);
  ASSERT_TRUE(b.ok()) << b.status();
  // What job 2's trainers map: the whole arena.
  auto share = tier_->Share(JobId(2));
  ASSERT_TRUE(share.ok()) << share.status();
  ASSERT_EQ(share->bytes, kBudget);
  void* map = mmap(nullptr, kBudget, PROT_READ, MAP_SHARED, share->read_only_fd.get(), 0);
  ASSERT_NE(map, MAP_FAILED);
  const auto* bytes = static_cast<const std::byte*>(map);
  uint64_t nonzero = 0;
  for (uint64_t i = 0; i < kBudget; ++i) nonzero += bytes[i] != std::byte{0} ? 1 : 0;
  munmap(map, kBudget);
  EXPECT_EQ(nonzero, 0u) << "job 2's arena holds " << nonzero << " bytes of job 1's";
  // And what the daemon reads from a slot not yet written.
  auto slot = tier_->Allocate(Key(2, 0), kSlot);
  ASSERT_TRUE(slot.ok()) << slot.status();
  std::vector<std::byte> read(kSlot, std::byte{0xFF});
  ASSERT_TRUE(tier_->Read(*slot, absl::MakeSpan(read)).ok());
  EXPECT_EQ(read, std::vector<std::byte>(kSlot, std::byte{0}));
  tier_->Free(*slot);
}

// No headroom: an arena is its budget rounded up to the slot alignment, and
// the device holds the admitted arenas and nothing more.
TEST(JobDeviceTierSizeTest, AnArenaIsItsBudgetRoundedUpAndTheDeviceHoldsJustTheArenas) {
  EmulatedDeviceOptions options;
  options.capacity_bytes = 256 << 10;  // what DeviceArena gives: --device_capacity, not twice it
  options.shared_memory = true;
  auto device = EmulatedDevice::Create(options);
  ASSERT_TRUE(device.ok());
  JobDeviceTierOptions tier_options;
  tier_options.capacity_bytes = 256 << 10;
  auto tier = JobDeviceTier::Create(device->get(), tier_options);
  ASSERT_TRUE(tier.ok());
  auto a = (*tier)->OpenJob(JobId(1), 96 << 10);
  ASSERT_TRUE(a.ok()) << a.status();
  auto share = (*tier)->Share(JobId(1));
  ASSERT_TRUE(share.ok());
  EXPECT_EQ(share->bytes, 96u << 10);
  EXPECT_EQ((*tier)->budget_bytes(), 96u << 10);
  EXPECT_EQ((*tier)->arena_bytes(), 96u << 10);
  // A budget off the alignment gets an arena rounded up, and admission
  // counts what the device gives: 100 KiB + 1 takes 104 KiB.
  auto b = (*tier)->OpenJob(JobId(2), (100 << 10) + 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*tier)->ArenaBytesOf(JobId(2)), 104u << 10);
  EXPECT_EQ((*tier)->Share(JobId(2))->bytes, 104u << 10);
  auto over = (*tier)->OpenJob(JobId(3), (56 << 10) + 1);  // 60 KiB rounded; 56 KiB left
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_NE(over.status().message().find("56.0 KiB of --device_capacity 256.0 KiB left"), absl::string_view::npos)
      << over.status();
  auto c = (*tier)->OpenJob(JobId(3), 56 << 10);  // the budgets fill the capacity, the arenas the device
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*tier)->arena_bytes(), 256u << 10);
  EXPECT_EQ((*device)->allocated_bytes(), 256u << 10);
  EXPECT_EQ((*tier)->OpenJob(JobId(4), 4 << 10).status().code(), absl::StatusCode::kResourceExhausted);
}

// The case the 2x headroom was for, in an arena of exactly the budget: job 1
// (80 KiB) holds A 24, B 16, C 24, D 16 KiB, all large enough to be placed
// from the bottom, in that order; with B and D evicted, 32 KiB are free in
// two 16 KiB ranges, so a new 32 KiB shard E fits the budget exactly but no
// free range. The store evicts job 1's own copies until E fits; job 2's
// arena (16 KiB shards F and G filling it) is never touched.
class JobDeviceTierFragmentationTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kKiB = 1024;
  static constexpr TierKind kDev = TierKind::kDevice;
  static constexpr TierKind kHome = TierKind::kPinnedHost;
  enum : uint32_t { kA = 1, kB = 2, kC = 3, kD = 4, kE = 5, kF = 6, kG = 7 };
  static uint64_t SizeOf(uint32_t t) { return (t == kE ? 32 : t == kA || t == kC ? 24 : 16) * kKiB; }
  static ShardKey K(uint32_t t) {
    return ShardKey{JobId(t >= kF ? 2 : 1), Rank(0), TensorId(t), TensorKind::kParam16, 0};
  }
  static std::vector<std::byte> Pattern(uint32_t t, uint8_t version = 0) {
    std::vector<std::byte> out(SizeOf(t));
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>((i * 13 + t * 29 + version * 101) & 0xff);
    return out;
  }

  void SetUp() override {
    EmulatedDeviceOptions device_options;
    device_options.capacity_bytes = 112 << 10;  // exactly the budgets
    device_options.shared_memory = true;
    auto device = EmulatedDevice::Create(device_options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    JobDeviceTierOptions tier_options;
    tier_options.capacity_bytes = 112 << 10;
    auto tier = JobDeviceTier::Create(device_.get(), tier_options);
    ASSERT_TRUE(tier.ok()) << tier.status();
    tier_ = std::move(*tier);
    auto job1 = tier_->OpenJob(JobId(1), 80 << 10);
    auto job2 = tier_->OpenJob(JobId(2), 32 << 10);
    ASSERT_TRUE(job1.ok() && job2.ok());
    job1_ = std::move(*job1);
    job2_ = std::move(*job2);
    auto home = PinnedHostTier::Create({.capacity_bytes = 1 << 20, .lock = MemoryLockMode::kBestEffort});
    ASSERT_TRUE(home.ok()) << home.status();
    home_ = std::move(*home);
    auto executor = ThreadPoolExecutor::Create(2);
    ASSERT_TRUE(executor.ok());
    executor_ = std::move(*executor);
    TieredStoreOptions store_options;
    store_options.clock = &clock_;
    store_options.executor = executor_.get();
    auto store = TieredStore::Create({tier_.get(), home_.get()}, store_options);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    // The store's budgets are the arenas' (as ParamCache::SetDeviceBudget).
    ASSERT_TRUE(store_->SetJobBudget(JobId(1), kDev, 80 << 10).ok());
    ASSERT_TRUE(store_->SetJobBudget(JobId(2), kDev, 32 << 10).ok());
    for (uint32_t t : {kA, kB, kC, kD, kE, kF, kG}) ASSERT_TRUE(store_->AddShard(K(t), kHome, Pattern(t)).ok());
    for (uint32_t t : {kF, kG, kA, kB, kC, kD}) ASSERT_EQ(Read(t, kDev), Pattern(t));
    ASSERT_TRUE(store_->Evict(K(kB), kDev).ok());
    ASSERT_TRUE(store_->Evict(K(kD), kDev).ok());
    auto space = tier_->FreeSpaceFor(K(kE));
    ASSERT_TRUE(space.has_value());
    ASSERT_EQ(space->free_bytes, 32 * kKiB);
    ASSERT_EQ(space->largest_free_range, 16 * kKiB);  // the budget allows E, no range holds it
    ASSERT_EQ(store_->job_charged_bytes(JobId(1), kDev) + SizeOf(kE), 80 * kKiB);
  }
  void TearDown() override {
    store_.reset();  // frees every slot before the arenas go
    job1_.reset();
    job2_.reset();
  }
  std::vector<std::byte> Read(uint32_t t, TierKind tier) {
    auto lease = store_->Acquire(K(t), tier, AccessMode::kRead);
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return {};
    std::vector<std::byte> out(SizeOf(t));
    EXPECT_TRUE(store_->ReadShard(*lease, absl::MakeSpan(out)).ok());
    EXPECT_TRUE(store_->Release(lease->id, false).ok());
    return out;
  }
  // Job 2's whole arena, as its trainer maps it.
  std::vector<std::byte> Job2Arena() {
    auto share = tier_->Share(JobId(2));
    EXPECT_TRUE(share.ok()) << share.status();
    if (!share.ok()) return {};
    std::vector<std::byte> out(share->bytes);
    EXPECT_EQ(pread(share->read_only_fd.get(), out.data(), out.size(), 0), static_cast<ssize_t>(out.size()));
    return out;
  }

  FakeClock clock_;
  std::unique_ptr<EmulatedDevice> device_;
  std::unique_ptr<JobDeviceTier> tier_;
  std::unique_ptr<JobDeviceArena> job1_, job2_;
  std::unique_ptr<PinnedHostTier> home_;
  std::unique_ptr<ThreadPoolExecutor> executor_;
  std::unique_ptr<TieredStore> store_;
};

TEST_F(JobDeviceTierFragmentationTest, TheSlotIsMadeByEvictingTheJobsOwnUnpinnedCopies) {
  // A is rewritten on the device (dirty), then C used: A is the least
  // recently used, and its eviction must write it home first.
  {
    auto writer = store_->Acquire(K(kA), kDev, AccessMode::kWrite);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE(store_->WriteShard(*writer, Pattern(kA, 1)).ok());
    ASSERT_TRUE(store_->Release(writer->id, true).ok());
  }
  EXPECT_EQ(Read(kC, kDev), Pattern(kC));
  const std::vector<std::byte> job2_before = Job2Arena();
  auto e = store_->Acquire(K(kE), kDev, AccessMode::kRead);
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<std::byte> got(SizeOf(kE));
  ASSERT_TRUE(store_->ReadShard(*e, absl::MakeSpan(got)).ok());
  EXPECT_EQ(got, Pattern(kE));
  EXPECT_LE(e->slot.offset_bytes + e->slot.footprint_bytes, 80 * kKiB);  // in job 1's arena of its budget
  ASSERT_TRUE(store_->Release(e->id, false).ok());
  EXPECT_FALSE(store_->IsResident(K(kA), kDev));
  EXPECT_TRUE(store_->IsResident(K(kC), kDev));
  EXPECT_EQ(store_->job_charged_bytes(JobId(1), kDev), 56 * kKiB);  // C and E
  // Job 2: its copies resident, its arena byte for byte as before.
  EXPECT_TRUE(store_->IsResident(K(kF), kDev));
  EXPECT_TRUE(store_->IsResident(K(kG), kDev));
  EXPECT_EQ(Job2Arena(), job2_before);
  EXPECT_EQ(store_->job_stats(JobId(2)).tier(kDev).evictions, 0u);
  // Bit-exact: the resident copies, and the evicted ones read back (A's
  // rewrite reached its home before its device slot was given up).
  EXPECT_EQ(Read(kC, kDev), Pattern(kC));
  EXPECT_EQ(Read(kF, kDev), Pattern(kF));
  EXPECT_EQ(Read(kG, kDev), Pattern(kG));
  EXPECT_EQ(Read(kA, kHome), Pattern(kA, 1));
  EXPECT_EQ(Read(kB, kHome), Pattern(kB));
  EXPECT_EQ(Read(kD, kHome), Pattern(kD));
  EXPECT_EQ(Read(kA, kDev), Pattern(kA, 1));  // and back up, evicting again as needed
  absl::Status invariants = store_->CheckInvariants();
  EXPECT_TRUE(invariants.ok()) << invariants;
}

TEST_F(JobDeviceTierFragmentationTest, WithEverythingPinnedItIsResourceExhaustedNamingFragmentedAndTheNumbers) {
  auto a = store_->Acquire(K(kA), kDev, AccessMode::kRead);
  auto c = store_->Acquire(K(kC), kDev, AccessMode::kRead);
  ASSERT_TRUE(a.ok() && c.ok());
  const std::vector<std::byte> job2_before = Job2Arena();
  auto e = store_->Acquire(K(kE), kDev, AccessMode::kRead);
  ASSERT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted) << e.status();
  const std::string message(e.status().message());
  for (const char* part : {"fragmented", "budget of 80.0 KiB", "32.0 KiB requested", "32.0 KiB are free",
                           "largest free range is 16.0 KiB", "pinned"}) {
    EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
  }
  // Nothing moved: the pinned slots where their holders read them, job 2 as it was.
  EXPECT_TRUE(store_->IsResident(K(kA), kDev));
  EXPECT_TRUE(store_->IsResident(K(kC), kDev));
  auto a_again = store_->Acquire(K(kA), kDev, AccessMode::kRead);
  ASSERT_TRUE(a_again.ok());
  EXPECT_EQ(a_again->slot.offset_bytes, a->slot.offset_bytes);
  ASSERT_TRUE(store_->Release(a_again->id, false).ok());
  EXPECT_EQ(Job2Arena(), job2_before);
  ASSERT_TRUE(store_->Release(a->id, false).ok());
  ASSERT_TRUE(store_->Release(c->id, false).ok());
  EXPECT_EQ(Read(kE, kDev), Pattern(kE));  // once unpinned it fits
  absl::Status invariants = store_->CheckInvariants();
  EXPECT_TRUE(invariants.ok()) << invariants;
}

}  // namespace
}  // namespace strata
