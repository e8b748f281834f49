#include "tiers/tiered_store.h"

#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tiers/testing/store_world.h"

namespace strata {
namespace {

constexpr size_t kShard = 64 << 10;  // 8 fit in the 512 KiB device tier
constexpr TierKind kDev = TierKind::kDevice;
constexpr TierKind kHome = TierKind::kPinnedHost;

class TieredStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { Build({}); }
  void Build(const StoreWorldOptions& options) {
    world_.reset();
    auto world = StoreWorld::Create(options);
    ASSERT_TRUE(world.ok()) << world.status();
    world_ = std::move(*world);
  }
  TieredStore& store() { return *world_->store; }
  void Add(uint32_t tensor, uint64_t job = 1) {
    ASSERT_TRUE(store().AddShard(TestKey(tensor, job), kHome, Filled(kShard, tensor)).ok());
  }
  std::vector<std::byte> ReadVia(uint32_t tensor, TierKind tier, uint64_t job = 1) {
    auto lease = store().Acquire(TestKey(tensor, job), tier, AccessMode::kRead);
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

TEST_F(TieredStoreTest, AcquireInDevicePromotesAndReturnsTheData) {
  Add(7);
  EXPECT_FALSE(store().IsResident(TestKey(7), kDev));
  EXPECT_EQ(ReadVia(7, kDev), Filled(kShard, 7));
  EXPECT_TRUE(store().IsResident(TestKey(7), kDev));
  const StoreStats stats = store().stats();
  EXPECT_EQ(stats.tier(kDev).acquire_misses, 1u);
  EXPECT_EQ(ReadVia(7, kDev), Filled(kShard, 7));
  EXPECT_EQ(store().stats().tier(kDev).acquire_hits, 1u);
  EXPECT_EQ(store().stats().bytes_up, kShard);
  ExpectInvariants();
}

TEST_F(TieredStoreTest, AcquireWaitsForTheInFlightPromotionInsteadOfStartingAnother) {
  Add(1);
  world_->home->CloseReadGate();
  auto promote = store().Promote(TestKey(1), kDev);
  ASSERT_TRUE(promote.ok());
  world_->home->AwaitReadsStarted(1);
  auto again = store().Promote(TestKey(1), kDev);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(promote->get(), again->get());  // the same transfer
  EXPECT_TRUE(store().IsInFlight(TestKey(1), kDev));

  absl::StatusOr<Lease> lease;
  std::thread client([&] { lease = store().Acquire(TestKey(1), kDev, AccessMode::kRead); });
  // The client has counted its miss (under the store's lock) before it waits.
  while (store().stats().tier(kDev).acquire_misses == 0) std::this_thread::yield();
  EXPECT_FALSE((*promote)->done());
  world_->home->OpenReadGate();
  client.join();
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_TRUE((*promote)->Wait().ok());
  EXPECT_EQ(world_->home->reads(), 1u);  // one promotion read the home copy
  EXPECT_EQ(store().stats().tier(kDev).promotions, 1u);
  EXPECT_EQ(store().stats().tier(kDev).acquire_misses, 1u);
  ASSERT_TRUE(store().Release(lease->id, false).ok());
  ExpectInvariants();
}

// TSan found a promotion reading the home copy while a client wrote it
// through a lease (tiered_store_concurrency_test): the copy was torn.
TEST_F(TieredStoreTest, NoTransferReadsACopyUnderAWriteLease) {
  Add(1);
  auto writer = store().Acquire(TestKey(1), kHome, AccessMode::kWrite);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_TRUE(absl::IsUnavailable(store().Promote(TestKey(1), kDev).status()));
  absl::StatusOr<Lease> reader;
  std::thread client([&] { reader = store().Acquire(TestKey(1), kDev, AccessMode::kRead); });
  while (store().stats().tier(kDev).acquire_misses == 0) std::this_thread::yield();
  ASSERT_TRUE(store().WriteShard(*writer, Filled(kShard, 42)).ok());
  EXPECT_EQ(world_->home->reads(), 0u);  // nothing read the copy being written
  ExpectInvariants();
  ASSERT_TRUE(store().Release(writer->id, true).ok());
  client.join();
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::byte> out(kShard);
  ASSERT_TRUE(store().ReadShard(*reader, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, Filled(kShard, 42));
  ASSERT_TRUE(store().Release(reader->id, false).ok());
  ExpectInvariants();
}

TEST_F(TieredStoreTest, WriteLeaseWaitsForTheTransferReadingTheCopy) {
  Add(1);
  world_->home->CloseReadGate();
  auto promote = store().Promote(TestKey(1), kDev);
  ASSERT_TRUE(promote.ok()) << promote.status();
  world_->home->AwaitReadsStarted(1);
  absl::StatusOr<Lease> writer;
  bool transfer_done_at_grant = false;
  std::thread client([&] {
    writer = store().Acquire(TestKey(1), kHome, AccessMode::kWrite);
    transfer_done_at_grant = (*promote)->done();
  });
  // Time for the client to reach Acquire while the transfer is held (a
  // slower client only makes the check weaker, never wrong).
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  world_->home->OpenReadGate();
  client.join();
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_TRUE(transfer_done_at_grant);
  EXPECT_TRUE((*promote)->Wait().ok());
  ASSERT_TRUE(store().Release(writer->id, false).ok());
  ExpectInvariants();
}

TEST_F(TieredStoreTest, PromotionIntoAFullTierEvictsTheLeastRecentlyUsed) {
  for (uint32_t t = 1; t <= 9; ++t) Add(t);
  for (uint32_t t = 1; t <= 8; ++t) ReadVia(t, kDev);
  ReadVia(1, kDev);  // 2 is now the least recently used
  ReadVia(9, kDev);
  EXPECT_FALSE(store().IsResident(TestKey(2), kDev));
  EXPECT_TRUE(store().IsResident(TestKey(1), kDev));
  EXPECT_TRUE(store().IsResident(TestKey(9), kDev));
  EXPECT_EQ(store().stats().tier(kDev).evictions, 1u);
  EXPECT_EQ(store().charged_bytes(kDev), 8 * kShard);
  ExpectInvariants();
}

TEST_F(TieredStoreTest, PinnedCopiesAreNeverEvicted) {
  for (uint32_t t = 1; t <= 9; ++t) Add(t);
  std::vector<Lease> leases;
  for (uint32_t t = 1; t <= 8; ++t) {
    auto lease = store().Acquire(TestKey(t), kDev, AccessMode::kRead);
    ASSERT_TRUE(lease.ok());
    leases.push_back(*lease);
  }
  auto ninth = store().Acquire(TestKey(9), kDev, AccessMode::kRead);
  EXPECT_EQ(ninth.status().code(), absl::StatusCode::kResourceExhausted) << ninth.status();
  for (uint32_t t = 1; t <= 8; ++t) EXPECT_TRUE(store().IsResident(TestKey(t), kDev));
  ExpectInvariants();
  ASSERT_TRUE(store().Release(leases[3].id, false).ok());
  EXPECT_TRUE(store().Acquire(TestKey(9), kDev, AccessMode::kRead).ok());
  EXPECT_FALSE(store().IsResident(TestKey(4), kDev));
  ExpectInvariants();
}

TEST_F(TieredStoreTest, DirtyCopyIsWrittenBackBeforeEviction) {
  for (uint32_t t = 1; t <= 9; ++t) Add(t);
  auto lease = store().Acquire(TestKey(1), kDev, AccessMode::kWrite);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(store().WriteShard(*lease, Filled(kShard, 0xee)).ok());
  ASSERT_TRUE(store().Release(lease->id, true).ok());
  EXPECT_TRUE(store().Describe(TestKey(1))->dirty);
  for (uint32_t t = 2; t <= 9; ++t) ReadVia(t, kDev);  // evicts 1
  EXPECT_FALSE(store().IsResident(TestKey(1), kDev));
  EXPECT_FALSE(store().Describe(TestKey(1))->dirty);
  EXPECT_EQ(store().stats().tier(kDev).write_backs, 1u);
  EXPECT_EQ(store().stats().bytes_down, kShard);
  EXPECT_EQ(ReadVia(1, kHome), Filled(kShard, 0xee));
  ExpectInvariants();
}

TEST_F(TieredStoreTest, EarlyWriteBackCleansTheCopyInPlace) {
  for (uint32_t t = 1; t <= 9; ++t) Add(t);
  auto lease = store().Acquire(TestKey(1), kDev, AccessMode::kWrite);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(store().WriteShard(*lease, Filled(kShard, 0x5c)).ok());
  ASSERT_TRUE(store().Release(lease->id, true).ok());
  auto cached = store().CachedCopies(kDev);
  ASSERT_EQ(cached.size(), 1u);
  EXPECT_TRUE(cached[0].dirty);
  auto write_back = store().WriteBack(TestKey(1));
  ASSERT_TRUE(write_back.ok());
  ASSERT_TRUE((*write_back)->Wait().ok());
  EXPECT_EQ((*write_back)->bytes_down(), kShard);
  EXPECT_FALSE(store().Describe(TestKey(1))->dirty);
  EXPECT_TRUE(store().IsResident(TestKey(1), kDev));
  EXPECT_FALSE(store().CachedCopies(kDev)[0].dirty);
  for (uint32_t t = 2; t <= 9; ++t) ReadVia(t, kDev);  // evicts 1: a clean drop now
  EXPECT_FALSE(store().IsResident(TestKey(1), kDev));
  EXPECT_EQ(store().stats().tier(kDev).write_backs, 0u);
  EXPECT_EQ(ReadVia(1, kHome), Filled(kShard, 0x5c));
  ExpectInvariants();
}

TEST_F(TieredStoreTest, FailedWriteBackKeepsTheDirtyDataAndFailsThePromotion) {
  for (uint32_t t = 1; t <= 9; ++t) Add(t);
  auto lease = store().Acquire(TestKey(1), kDev, AccessMode::kWrite);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(store().WriteShard(*lease, Filled(kShard, 0xab)).ok());
  ASSERT_TRUE(store().Release(lease->id, true).ok());
  for (uint32_t t = 2; t <= 8; ++t) ReadVia(t, kDev);
  world_->home->FailNthWrite(1);
  auto ninth = store().Acquire(TestKey(9), kDev, AccessMode::kRead);
  EXPECT_EQ(ninth.status().code(), absl::StatusCode::kDataLoss) << ninth.status();
  EXPECT_TRUE(store().IsResident(TestKey(1), kDev));
  EXPECT_TRUE(store().Describe(TestKey(1))->dirty);
  ExpectInvariants();
  // The next attempt succeeds and the data reaches home.
  EXPECT_TRUE(store().Acquire(TestKey(9), kDev, AccessMode::kRead).ok());
  EXPECT_EQ(ReadVia(1, kHome), Filled(kShard, 0xab));
  ExpectInvariants();
}

TEST_F(TieredStoreTest, FailedPromotionReturnsTheErrorAndReleasesItsCharge) {
  Add(1);
  world_->home->FailNthRead(1);
  auto lease = store().Acquire(TestKey(1), kDev, AccessMode::kRead);
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kDataLoss) << lease.status();
  EXPECT_NE(lease.status().message().find("job1/rank0/t1"), std::string::npos);
  EXPECT_EQ(store().charged_bytes(kDev), 0u);
  ExpectInvariants();
  EXPECT_EQ(ReadVia(1, kDev), Filled(kShard, 1));
}

TEST_F(TieredStoreTest, ExpiredLeasesLoseTheirPins) {
  Add(1);
  auto lease = store().Acquire(TestKey(1), kDev, AccessMode::kRead, absl::Seconds(10));
  ASSERT_TRUE(lease.ok());
  world_->clock.Advance(absl::Seconds(9));
  EXPECT_EQ(store().ExpireLeases(), 0u);
  ASSERT_TRUE(store().RenewLease(lease->id, absl::Seconds(10)).ok());
  world_->clock.Advance(absl::Seconds(9));
  EXPECT_EQ(store().ExpireLeases(), 0u);
  world_->clock.Advance(absl::Seconds(2));
  EXPECT_EQ(store().ExpireLeases(), 1u);
  EXPECT_EQ(store().Describe(TestKey(1))->pins[TierIndex(kDev)], 0);
  EXPECT_EQ(store().Release(lease->id, false).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store().stats().leases_expired, 1u);
  ExpectInvariants();
}

TEST_F(TieredStoreTest, EvictionReclaimsPinsOfDeadClientsWhenEverythingIsPinned) {
  for (uint32_t t = 1; t <= 9; ++t) Add(t);
  for (uint32_t t = 1; t <= 8; ++t) {
    ASSERT_TRUE(store().Acquire(TestKey(t), kDev, AccessMode::kRead, absl::Seconds(5)).ok());
  }
  EXPECT_EQ(store().Acquire(TestKey(9), kDev, AccessMode::kRead).status().code(),
            absl::StatusCode::kResourceExhausted);
  world_->clock.Advance(absl::Seconds(6));  // every holder is presumed dead
  EXPECT_TRUE(store().Acquire(TestKey(9), kDev, AccessMode::kRead).ok());
  EXPECT_EQ(store().stats().leases_expired, 8u);
  ExpectInvariants();
}

TEST_F(TieredStoreTest, JobBudgetEvictsTheJobsOwnCopiesOnly) {
  for (uint32_t t = 1; t <= 4; ++t) Add(t, /*job=*/1);
  for (uint32_t t = 1; t <= 2; ++t) Add(t, /*job=*/2);
  ASSERT_TRUE(store().SetJobBudget(JobId(1), kDev, 2 * kShard).ok());
  ReadVia(1, kDev, 2);
  ReadVia(2, kDev, 2);
  for (uint32_t t = 1; t <= 4; ++t) ReadVia(t, kDev, 1);
  EXPECT_EQ(store().job_charged_bytes(JobId(1), kDev), 2 * kShard);
  EXPECT_TRUE(store().IsResident(TestKey(1, 2), kDev));
  EXPECT_TRUE(store().IsResident(TestKey(2, 2), kDev));
  EXPECT_TRUE(store().IsResident(TestKey(3, 1), kDev));
  EXPECT_TRUE(store().IsResident(TestKey(4, 1), kDev));
  EXPECT_FALSE(store().IsResident(TestKey(1, 1), kDev));
  ExpectInvariants();
}

TEST_F(TieredStoreTest, DemoteWritesBackAndDropsTheCopy) {
  Add(1);
  auto lease = store().Acquire(TestKey(1), kDev, AccessMode::kWrite);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(store().WriteShard(*lease, Filled(kShard, 0x42)).ok());
  auto pinned = store().Demote(TestKey(1), kHome);
  EXPECT_EQ(pinned.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store().Release(lease->id, true).ok());
  auto demote = store().Demote(TestKey(1), kHome);
  ASSERT_TRUE(demote.ok());
  ASSERT_TRUE((*demote)->Wait().ok());
  EXPECT_EQ((*demote)->bytes_down(), kShard);
  EXPECT_FALSE(store().IsResident(TestKey(1), kDev));
  EXPECT_EQ(store().charged_bytes(kDev), 0u);
  EXPECT_EQ(ReadVia(1, kHome), Filled(kShard, 0x42));
  ExpectInvariants();
}

TEST_F(TieredStoreTest, WritingTheHomeCopyDropsTheStaleCachedCopy) {
  Add(1);
  ReadVia(1, kDev);
  auto lease = store().Acquire(TestKey(1), kHome, AccessMode::kWrite);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(store().WriteShard(*lease, Filled(kShard, 9)).ok());
  ASSERT_TRUE(store().Release(lease->id, true).ok());
  EXPECT_FALSE(store().IsResident(TestKey(1), kDev));
  EXPECT_EQ(store().charged_bytes(kDev), 0u);
  EXPECT_EQ(ReadVia(1, kDev), Filled(kShard, 9));
  ExpectInvariants();
}

TEST_F(TieredStoreTest, HomeAcquireOfADirtyShardWritesItBackFirst) {
  Add(1);
  auto lease = store().Acquire(TestKey(1), kDev, AccessMode::kWrite);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(store().WriteShard(*lease, Filled(kShard, 0x77)).ok());
  ASSERT_TRUE(store().Release(lease->id, true).ok());
  EXPECT_EQ(ReadVia(1, kHome), Filled(kShard, 0x77));
  EXPECT_FALSE(store().Describe(TestKey(1))->dirty);
  EXPECT_TRUE(store().IsResident(TestKey(1), kDev));  // still current: kept
  ExpectInvariants();
}

// A policy that never gives anything up.
class KeepEverythingPolicy final : public EvictionPolicy {
 public:
  std::optional<size_t> ChooseVictim(const EvictionRequest& request,
                                     absl::Span<const EvictionCandidate>) override {
    ++calls;
    last_demand = request.demand;
    return std::nullopt;
  }
  int calls = 0;
  bool last_demand = false;
};

TEST_F(TieredStoreTest, PolicyRefusalFailsThePromotionWithoutSideEffects) {
  KeepEverythingPolicy policy;
  Build({.policy = &policy});
  for (uint32_t t = 1; t <= 9; ++t) Add(t);
  for (uint32_t t = 1; t <= 8; ++t) ReadVia(t, kDev);
  auto promote = store().Promote(TestKey(9), kDev, {.prefetch = true});
  EXPECT_EQ(promote.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(promote.status().message().find("needed sooner"), std::string::npos)
      << promote.status();
  EXPECT_EQ(policy.calls, 1);
  EXPECT_FALSE(policy.last_demand);
  for (uint32_t t = 1; t <= 8; ++t) EXPECT_TRUE(store().IsResident(TestKey(t), kDev));
  EXPECT_EQ(store().stats().prefetches_issued, 0u);
  ExpectInvariants();
}

TEST_F(TieredStoreTest, PrefetchesAreCountedAsUsedOrWasted) {
  for (uint32_t t = 1; t <= 10; ++t) Add(t);
  for (uint32_t t = 1; t <= 8; ++t) {
    auto p = store().Promote(TestKey(t), kDev, {.prefetch = true});
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE((*p)->Wait().ok());
  }
  ReadVia(1, kDev);
  ReadVia(9, kDev);   // evicts 2, a prefetch never used
  ReadVia(10, kDev);  // evicts 3
  const StoreStats s = store().stats();
  EXPECT_EQ(s.prefetches_issued, 8u);
  EXPECT_EQ(s.prefetches_used, 1u);
  EXPECT_EQ(s.prefetches_wasted, 2u);
}

// The daemon reports prefetches per job and tier (`strata stats`' device
// row): each is counted in the tier it went into, for the job it is of.
TEST_F(TieredStoreTest, PrefetchCountsAreKeptPerTierAndJob) {
  for (uint32_t t = 1; t <= 4; ++t) Add(t, /*job=*/1);
  Add(1, /*job=*/2);
  auto prefetch = [&](uint32_t tensor, uint64_t job) {
    auto p = store().Promote(TestKey(tensor, job), kDev, {.prefetch = true});
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE((*p)->Wait().ok());
  };
  for (uint32_t t = 1; t <= 4; ++t) prefetch(t, 1);
  prefetch(1, 2);
  ReadVia(1, kDev, 1);  // used
  ReadVia(1, kDev, 2);  // used
  ASSERT_TRUE(store().Evict(TestKey(2, 1), kDev).ok());  // wasted (evicted)
  auto demote = store().Demote(TestKey(3, 1), kHome);     // wasted (demoted)
  ASSERT_TRUE(demote.ok()) << demote.status();
  ASSERT_TRUE((*demote)->Wait().ok());
  ASSERT_TRUE(store().Evict(TestKey(1, 1), kDev).ok());  // used before: not wasted
  const StoreStats one = store().job_stats(JobId(1));
  EXPECT_EQ(one.tier(kDev).prefetches_issued, 4u);
  EXPECT_EQ(one.tier(kDev).prefetches_used, 1u);
  EXPECT_EQ(one.tier(kDev).prefetches_wasted, 2u);
  EXPECT_EQ(one.tier(kHome).prefetches_issued, 0u);
  EXPECT_EQ(one.tier(kHome).prefetches_used, 0u);
  EXPECT_EQ(one.tier(kHome).prefetches_wasted, 0u);
  const StoreStats two = store().job_stats(JobId(2));
  EXPECT_EQ(two.tier(kDev).prefetches_issued, 1u);
  EXPECT_EQ(two.tier(kDev).prefetches_used, 1u);
  EXPECT_EQ(two.tier(kDev).prefetches_wasted, 0u);
  // The store-wide per-tier counts and the totals agree with the jobs'.
  const StoreStats all = store().stats();
  EXPECT_EQ(all.tier(kDev).prefetches_issued, 5u);
  EXPECT_EQ(all.tier(kDev).prefetches_used, 2u);
  EXPECT_EQ(all.tier(kDev).prefetches_wasted, 2u);
  EXPECT_EQ(all.prefetches_issued, 5u);
  EXPECT_EQ(all.prefetches_used, 2u);
  EXPECT_EQ(all.prefetches_wasted, 2u);
  EXPECT_EQ(one.prefetches_wasted, 2u);
  ExpectInvariants();
}

TEST_F(TieredStoreTest, RemoveShardRefusesWhilePinnedAndFreesEverything) {
  Add(1);
  auto lease = store().Acquire(TestKey(1), kDev, AccessMode::kRead);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(store().RemoveShard(TestKey(1)).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store().Release(lease->id, false).ok());
  ASSERT_TRUE(store().RemoveShard(TestKey(1)).ok());
  EXPECT_EQ(store().charged_bytes(kDev), 0u);
  EXPECT_EQ(store().charged_bytes(kHome), 0u);
  EXPECT_EQ(world_->pinned->used_bytes(), 0u);
  EXPECT_EQ(store().Acquire(TestKey(1), kDev, AccessMode::kRead).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(TieredStoreTest, HomeTierFullIsResourceExhausted) {
  Build({.home_bytes = 128 << 10});
  Add(1);
  Add(2);
  EXPECT_EQ(store().AddShard(TestKey(3), kHome, Filled(kShard, 3)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store().AddShard(TestKey(1), kHome, Filled(kShard, 3)).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(TieredStoreTest, ReadLeaseCannotBeReleasedDirtyNorWritten) {
  Add(1);
  auto lease = store().Acquire(TestKey(1), kDev, AccessMode::kRead);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(store().WriteShard(*lease, Filled(kShard, 1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store().Release(lease->id, true).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store().Release(lease->id, false).ok());
}


// Fragmentation: a 128 KiB device arena, job 2's shard F (32 KiB) first, then
// job 1 (budget 96 KiB) loads A 32, B 16, C 32, D 16 KiB; dropping B and D
// leaves 32 KiB free in two 16 KiB ranges. A new 32 KiB shard E fits job 1's
// budget (A + C + E = 96 KiB) and the tier's capacity, but no free range.
class TieredStoreFragmentationTest : public TieredStoreTest {
 protected:
  static constexpr uint64_t kKiB = 1024;
  enum : uint32_t { kA = 1, kB = 2, kC = 3, kD = 4, kE = 5, kF = 6 };
  static uint64_t SizeOf(uint32_t tensor) { return (tensor == kB || tensor == kD ? 16 : 32) * kKiB; }
  static uint64_t JobOf(uint32_t tensor) { return tensor == kF ? 2 : 1; }
  static ShardKey K(uint32_t tensor) { return TestKey(tensor, JobOf(tensor)); }
  // Distinct bytes per shard and version, so a mixed-up slot shows.
  static std::vector<std::byte> Pattern(uint32_t tensor, uint8_t version = 0) {
    std::vector<std::byte> out(SizeOf(tensor));
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>((i * 7 + tensor * 31 + version) & 0xff);
    return out;
  }
  void SetUp() override { MakeLayout({.device_bytes = 128 << 10}); }
  void MakeLayout(const StoreWorldOptions& options) {
    Build(options);
    ASSERT_TRUE(store().SetJobBudget(JobId(1), kDev, 96 * kKiB).ok());
    for (uint32_t t : {kA, kB, kC, kD, kE, kF}) ASSERT_TRUE(store().AddShard(K(t), kHome, Pattern(t)).ok());
    for (uint32_t t : {kF, kA, kB, kC, kD}) EXPECT_EQ(Read(t, kDev), Pattern(t));
    ASSERT_TRUE(store().Evict(K(kB), kDev).ok());
    ASSERT_TRUE(store().Evict(K(kD), kDev).ok());
    EXPECT_EQ(store().job_charged_bytes(JobId(1), kDev), 64 * kKiB);
    auto space = world_->device_tier->FreeSpaceFor(K(kE));
    ASSERT_TRUE(space.has_value());
    EXPECT_EQ(space->free_bytes, 32 * kKiB);
    EXPECT_EQ(space->largest_free_range, 16 * kKiB);  // fragmented
  }
  std::vector<std::byte> Read(uint32_t tensor, TierKind tier) {
    auto lease = store().Acquire(K(tensor), tier, AccessMode::kRead);
    EXPECT_TRUE(lease.ok()) << lease.status();
    if (!lease.ok()) return {};
    std::vector<std::byte> out(SizeOf(tensor));
    EXPECT_TRUE(store().ReadShard(*lease, absl::MakeSpan(out)).ok());
    EXPECT_TRUE(store().Release(lease->id, false).ok());
    return out;
  }
};

TEST_F(TieredStoreFragmentationTest, AFragmentedArenaEvictsTheJobsOwnCopiesUntilTheSlotFits) {
  // A is rewritten on the device (dirty: the only copy of version 1), then C
  // is used, so A is the least recently used: the victim needs a write-back.
  {
    auto writer = store().Acquire(K(kA), kDev, AccessMode::kWrite);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE(store().WriteShard(*writer, Pattern(kA, 1)).ok());
    ASSERT_TRUE(store().Release(writer->id, true).ok());
  }
  EXPECT_EQ(Read(kC, kDev), Pattern(kC));
  const uint64_t evictions = store().stats().tier(kDev).evictions;
  EXPECT_EQ(Read(kE, kDev), Pattern(kE));  // fits after evicting A, which leaves 48 KiB free in one range
  EXPECT_TRUE(store().IsResident(K(kE), kDev));
  EXPECT_FALSE(store().IsResident(K(kA), kDev));
  EXPECT_TRUE(store().IsResident(K(kC), kDev));
  EXPECT_EQ(store().stats().tier(kDev).evictions, evictions + 1);  // A alone was enough
  EXPECT_EQ(store().job_charged_bytes(JobId(1), kDev), 64 * kKiB);
  // The other job's copy is untouched.
  EXPECT_TRUE(store().IsResident(K(kF), kDev));
  EXPECT_EQ(Read(kF, kDev), Pattern(kF));
  // Bit-exact: what stays resident, and what was evicted read back (A's
  // rewrite reached its home before its slot was given up).
  EXPECT_EQ(Read(kC, kDev), Pattern(kC));
  EXPECT_EQ(Read(kA, kHome), Pattern(kA, 1));
  EXPECT_EQ(Read(kB, kHome), Pattern(kB));
  EXPECT_EQ(Read(kD, kHome), Pattern(kD));
  EXPECT_EQ(store().stats().tier(kDev).write_backs, 1u);
  ExpectInvariants();
}

TEST_F(TieredStoreFragmentationTest, WithTheJobsCopiesPinnedItIsResourceExhaustedNamingFragmentedAndTheNumbers) {
  auto a = store().Acquire(K(kA), kDev, AccessMode::kRead);
  auto c = store().Acquire(K(kC), kDev, AccessMode::kRead);
  ASSERT_TRUE(a.ok() && c.ok());
  auto e = store().Acquire(K(kE), kDev, AccessMode::kRead);
  ASSERT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted) << e.status();
  const std::string message(e.status().message());
  for (const char* part : {"fragmented", "budget of 96.0 KiB", "32.0 KiB requested", "32.0 KiB are free",
                           "largest free range is 16.0 KiB", "pinned"}) {
    EXPECT_NE(message.find(part), std::string::npos) << part << " not in: " << message;
  }
  // Nothing was evicted for it: the pinned copies stay, job 2's too.
  EXPECT_TRUE(store().IsResident(K(kA), kDev));
  EXPECT_TRUE(store().IsResident(K(kC), kDev));
  EXPECT_TRUE(store().IsResident(K(kF), kDev));
  EXPECT_EQ(store().job_charged_bytes(JobId(1), kDev), 64 * kKiB);
  ExpectInvariants();
  ASSERT_TRUE(store().Release(a->id, false).ok());
  ASSERT_TRUE(store().Release(c->id, false).ok());
  EXPECT_EQ(Read(kE, kDev), Pattern(kE));  // once unpinned, it fits
  EXPECT_EQ(Read(kF, kDev), Pattern(kF));
  ExpectInvariants();
}

// A prefetch the policy will not make room for is refused rather than
// evicting a copy needed sooner.
class RefuseAllPolicy final : public EvictionPolicy {
 public:
  std::optional<size_t> ChooseVictim(const EvictionRequest& request,
                                     absl::Span<const EvictionCandidate> candidates) override {
    if (request.demand) return lru_.ChooseVictim(request, candidates);
    return std::nullopt;
  }
  LruPolicy lru_;
};

TEST_F(TieredStoreFragmentationTest, APrefetchThePolicyRefusesRoomForIsRefusedWithTheNumbers) {
  RefuseAllPolicy policy;
  MakeLayout({.device_bytes = 128 << 10, .policy = &policy});  // the same layout under the refusing policy
  auto prefetch = store().Promote(K(kE), kDev, PromoteOptions{.prefetch = true});
  ASSERT_TRUE(prefetch.ok()) << prefetch.status();  // the charge fits: no victim needed for bytes
  absl::Status moved = (*prefetch)->Wait();
  EXPECT_EQ(moved.code(), absl::StatusCode::kResourceExhausted) << moved;
  EXPECT_NE(moved.message().find("fragmented"), absl::string_view::npos) << moved;
  EXPECT_TRUE(store().IsResident(K(kA), kDev));
  EXPECT_TRUE(store().IsResident(K(kC), kDev));
  EXPECT_FALSE(store().IsResident(K(kE), kDev));
  ExpectInvariants();
  EXPECT_EQ(Read(kE, kDev), Pattern(kE));  // on demand it gets room
  ExpectInvariants();
}

// WriteHome: new bytes for a whole shard go to its home from the caller's
// buffer (no cached slot written first), and no stale cached copy survives.
TEST_F(TieredStoreTest, WriteHomeTheHomeTakesTheBytesAndTheCachedCopyGoes) {
  Add(1);
  ASSERT_EQ(ReadVia(1, kDev), Filled(kShard, 1));  // a clean cached copy
  ASSERT_TRUE(store().IsResident(TestKey(1), kDev));
  const uint64_t in_before = store().job_stats(JobId(1)).tier(kHome).bytes_in;
  const std::vector<std::byte> fresh = Filled(kShard, 42);
  ASSERT_TRUE(store().WriteHome(TestKey(1), fresh).ok());
  EXPECT_FALSE(store().IsResident(TestKey(1), kDev));  // it would have been stale
  EXPECT_EQ(ReadVia(1, kHome), fresh);
  EXPECT_EQ(ReadVia(1, kDev), fresh);  // promoted anew from the home
  EXPECT_EQ(store().job_stats(JobId(1)).tier(kHome).bytes_in - in_before, kShard);
  ExpectInvariants();
}

TEST_F(TieredStoreTest, WriteHomeAPinnedCopyRefusesAndNothingChanges) {
  Add(1);
  auto lease = store().Acquire(TestKey(1), kDev, AccessMode::kRead);
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::Status s = store().WriteHome(TestKey(1), Filled(kShard, 9));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("pinned or moving"), std::string::npos) << s;
  std::vector<std::byte> seen(kShard);
  ASSERT_TRUE(store().ReadShard(*lease, absl::MakeSpan(seen)).ok());
  EXPECT_EQ(seen, Filled(kShard, 1));
  ASSERT_TRUE(store().Release(lease->id, false).ok());
  EXPECT_EQ(ReadVia(1, kHome), Filled(kShard, 1));
  ExpectInvariants();
}

TEST_F(TieredStoreTest, WriteHomeADirtyCopyThatIsTheOnlyLatestRefusesUntilWrittenBack) {
  Add(1);
  auto lease = store().AcquireForOverwrite(TestKey(1), kDev);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(store().WriteShard(*lease, Filled(kShard, 7)).ok());
  ASSERT_TRUE(store().Release(lease->id, /*dirty=*/true).ok());
  EXPECT_EQ(store().WriteHome(TestKey(1), Filled(kShard, 8)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReadVia(1, kDev), Filled(kShard, 7));
  auto written = store().WriteBack(TestKey(1));
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_TRUE((*written)->Wait().ok());
  ASSERT_TRUE(store().WriteHome(TestKey(1), Filled(kShard, 8)).ok());
  EXPECT_EQ(ReadVia(1, kDev), Filled(kShard, 8));
  ExpectInvariants();
}

TEST_F(TieredStoreTest, WriteHomeAWrongSizeOrAnUnknownShardIsRefused) {
  Add(1);
  EXPECT_EQ(store().WriteHome(TestKey(1), Filled(kShard - 1, 3)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store().WriteHome(TestKey(2), Filled(kShard, 3)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadVia(1, kHome), Filled(kShard, 1));
  ExpectInvariants();
}

// InstallHome: the caller put the new version in the home's medium itself;
// the store drops the cached copies before and counts the bytes after.
TEST_F(TieredStoreTest, InstallHomeTakesTheCallersVersionAndTheCachedCopyGoes) {
  Add(1);
  ASSERT_EQ(ReadVia(1, kDev), Filled(kShard, 1));
  const uint64_t in_before = store().job_stats(JobId(1)).tier(kHome).bytes_in;
  const std::vector<std::byte> fresh = Filled(kShard, 42);
  bool cached_when_installed = true;
  absl::Status s = store().InstallHome(TestKey(1), [&](Tier& home, const TierSlot& slot) {
    cached_when_installed = store().IsResident(TestKey(1), kDev);
    return home.Write(slot, fresh);
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_FALSE(cached_when_installed);  // dropped before, so no reader saw a mix
  EXPECT_EQ(ReadVia(1, kDev), fresh);   // promoted anew from the home
  EXPECT_EQ(store().job_stats(JobId(1)).tier(kHome).bytes_in - in_before, kShard);
  ExpectInvariants();
}

TEST_F(TieredStoreTest, InstallHomeFailedOrRefusedLeavesTheHome) {
  Add(1);
  ASSERT_EQ(ReadVia(1, kDev), Filled(kShard, 1));
  absl::Status failed = store().InstallHome(
      TestKey(1), [](Tier&, const TierSlot&) { return absl::DataLossError("the renamed extent is gone"); });
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss) << failed;
  EXPECT_NE(failed.message().find("the renamed extent is gone"), std::string::npos) << failed;
  EXPECT_EQ(ReadVia(1, kDev), Filled(kShard, 1));
  // A pinned copy: refused before `install` runs.
  auto lease = store().Acquire(TestKey(1), kDev, AccessMode::kRead);
  ASSERT_TRUE(lease.ok()) << lease.status();
  bool called = false;
  absl::Status pinned = store().InstallHome(TestKey(1), [&](Tier&, const TierSlot&) {
    called = true;
    return absl::OkStatus();
  });
  EXPECT_EQ(pinned.code(), absl::StatusCode::kFailedPrecondition) << pinned;
  EXPECT_FALSE(called);
  ASSERT_TRUE(store().Release(lease->id, false).ok());
  EXPECT_EQ(store().InstallHome(TestKey(2), [](Tier&, const TierSlot&) { return absl::OkStatus(); }).code(),
            absl::StatusCode::kNotFound);
  ExpectInvariants();
}

}  // namespace
}  // namespace strata
