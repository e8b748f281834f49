// The ZeRO-Infinity window's parts: ParamCache gives an evicted slot's memory
// back (the arena's allocated blocks drop) and reads it back bit for bit;
// GradSpill's gradients come back from NVMe bit-identical, in step order, and
// leave nothing behind after DeleteAll.
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/grad_spill.h"
#include "daemon/param_cache.h"
#include "gtest/gtest.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"
#include "swap/testing/fault_plan.h"
#include "swap/testing/scratch_extent_store.h"
#include "tiers/pinned_arena.h"
#include "tiers/transfer_executor.h"

namespace strata {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kSlot = 4 * kPage;  // bytes per param slot in these tests
constexpr uint64_t kJob = 7;

// An extent store in a scratch directory whose writes tagged with `job`
// fail with EIO after the first (swap/testing/fault_plan.h).
struct FailingWritesStore {
  static std::unique_ptr<FailingWritesStore> Create(const std::string& name, uint64_t job) {
    auto dir = TestDir::Create(name);
    EXPECT_TRUE(dir.ok()) << dir.status();
    auto plan = ParseFaultPlan(absl::StrCat("tag=", job, ",op=write,kind=eio,after=1,run=1000"));
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!dir.ok() || !plan.ok()) return nullptr;
    auto out = std::unique_ptr<FailingWritesStore>(new FailingWritesStore{std::move(*dir), FaultPlanEngines(*plan), nullptr, nullptr});
    auto inner = NewPsyncEngine({});
    EXPECT_TRUE(inner.ok()) << inner.status();
    if (!inner.ok()) return nullptr;
    out->engine = out->faults.Wrap(std::move(*inner));
    ExtentStoreOptions options;
    options.paths = {out->dir.path()};
    options.capacity_bytes_per_path = 16 << 20;
    options.sync_policy = SyncPolicy::kNever;
    options.allow_buffered_fallback = true;
    auto store = ExtentStore::Open(options, out->engine.get());
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return nullptr;
    out->store = std::move(*store);
    return out;
  }

  TestDir dir;
  FaultPlanEngines faults;
  std::unique_ptr<IoEngine> engine;
  std::unique_ptr<ExtentStore> store;  // uses engine
};

class WindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto scratch = ScratchExtentStore::Create("window", 16 << 20);
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    store_ = scratch_->store();
    auto workers = ThreadPoolExecutor::Create(1);
    ASSERT_TRUE(workers.ok());
    workers_ = std::move(*workers);
  }

  static std::vector<std::byte> Pattern(uint64_t bytes, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::byte> out(bytes);
    for (std::byte& b : out) b = static_cast<std::byte>(rng());
    return out;
  }

  std::unique_ptr<ScratchExtentStore> scratch_;
  ExtentStore* store_ = nullptr;  // scratch_'s
  std::unique_ptr<ThreadPoolExecutor> workers_;
};

TEST_F(WindowTest, EvictedParamSlotsGiveTheirMemoryBackAndComeBackBitForBit) {
  constexpr uint32_t kShards = 8;
  PinnedArenaOptions o;
  o.name = "strata-test-window";
  o.size_bytes = kShards * kSlot;
  o.huge_pages = false;
  o.populate = false;
  auto arena = PinnedArena::Create(o);
  ASSERT_TRUE(arena.ok()) << arena.status();
  std::vector<std::pair<uint32_t, uint32_t>> discarded;
  ParamCache cache(
      kJob, 1, store_,
      [&](uint32_t, uint32_t index) { return ParamCache::ShardRef{arena->data() + index * kSlot, kSlot}; },
      /*budget_bytes=*/2 * kSlot, /*lookahead=*/0, workers_.get(),
      [&](uint32_t rank, uint32_t index) {
        discarded.emplace_back(rank, index);
        ASSERT_TRUE(arena->Discard(index * kSlot, kSlot).ok());
      });
  // The trainer writes every slot (as before InitParams); each goes home and
  // the cache keeps two.
  for (uint32_t i = 0; i < kShards; ++i) {
    const std::vector<std::byte> p = Pattern(kSlot, i);
    std::memcpy(arena->data() + i * kSlot, p.data(), kSlot);
    ASSERT_TRUE(cache.StoreHome(0, i).ok());
  }
  EXPECT_EQ(discarded.size(), kShards - 2);
  EXPECT_EQ(cache.resident_bytes(), 2 * kSlot);
  EXPECT_EQ(*arena->ResidentBytes(), 2 * kSlot);  // the memory really went back
  // Every shard comes back as it was stored, and memory stays within budget.
  for (uint32_t i = 0; i < kShards; ++i) {
    ASSERT_TRUE(cache.Acquire(0, {i}, absl::Now() + absl::Seconds(10)).ok());
    const std::vector<std::byte> p = Pattern(kSlot, i);
    ASSERT_EQ(std::memcmp(arena->data() + i * kSlot, p.data(), kSlot), 0) << "shard " << i;
    ASSERT_TRUE(cache.Release(0, {i}).ok());
    EXPECT_LE(*arena->ResidentBytes(), 2 * kSlot);
  }
  // Bytes reserved by others (gradients) push params out, pinned ones stay.
  ASSERT_TRUE(cache.Acquire(0, {3}, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(cache.SetReserved(2 * kSlot), kSlot);  // only the pinned shard is left
  EXPECT_EQ(*arena->ResidentBytes(), kSlot);
  EXPECT_FALSE(cache.Drop(0, 3));  // pinned
  ASSERT_TRUE(cache.Release(0, {3}).ok());
  EXPECT_TRUE(cache.Drop(0, 3));
  EXPECT_EQ(*arena->ResidentBytes(), 0u);
  EXPECT_EQ(cache.SetReserved(0), 0u);
}

TEST_F(WindowTest, SpilledGradientsComeBackBitIdenticalInStepOrder) {
  auto spill = GradSpill::Create(kJob, store_, 3 * kPage);
  ASSERT_TRUE(spill.ok()) << spill.status();
  EXPECT_EQ((*spill)->staging_bytes(), 12 * kPage);  // two read-back and two write buffers
  // Slots of different sizes; slot memory is page-aligned, as in a region.
  const uint64_t sizes[] = {3 * kPage, kPage, 2 * kPage, 3 * kPage};
  std::vector<std::vector<std::byte>> grads;
  auto buffer = AlignedBuffer::Allocate(3 * kPage, kPage);
  ASSERT_TRUE(buffer.ok());
  for (uint32_t i = 0; i < 4; ++i) {
    grads.push_back(Pattern(sizes[i], 100 + i));
    std::memcpy(buffer->data(), grads[i].data(), sizes[i]);
    ASSERT_TRUE((*spill)->Spill(i % 2, i, absl::Span<const std::byte>(buffer->data(), sizes[i])).ok());
  }
  EXPECT_EQ((*spill)->spilled_bytes(), 9 * kPage);
  // Shard 2 spilled again (a re-sent gradient) replaces the first copy.
  grads[2] = Pattern(sizes[2], 999);
  std::memcpy(buffer->data(), grads[2].data(), sizes[2]);
  ASSERT_TRUE((*spill)->Spill(0, 2, absl::Span<const std::byte>(buffer->data(), sizes[2])).ok());
  // The step wants 3, 0, 2 (1 stayed in its slot).
  std::vector<std::pair<ShardId, uint64_t>> order = {
      {ShardId{1, 3}, sizes[3]}, {ShardId{0, 0}, sizes[0]}, {ShardId{0, 2}, sizes[2]}};
  (*spill)->BeginReadback(order);
  for (const auto& [id, bytes] : order) {
    auto got = (*spill)->Next(id);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(std::memcmp(*got, grads[id.index].data(), bytes), 0) << "shard " << id.index;
  }
  EXPECT_EQ((*spill)->read_back_bytes(), 8 * kPage);
  // Out of order is refused, not answered with another shard's bytes.
  (*spill)->BeginReadback({{ShardId{1, 3}, sizes[3]}});
  EXPECT_EQ((*spill)->Next(ShardId{0, 0}).status().code(), absl::StatusCode::kInternal);
  (*spill)->EndReadback();
  // Deleted before the job's commit: nothing of them is left, durable or not.
  (*spill)->DeleteAll();
  ASSERT_TRUE(store_->Commit(kJob).ok());
  for (uint32_t i = 0; i < 4; ++i) EXPECT_FALSE(store_->Contains(GradSpill::Key(kJob, i % 2, i))) << i;
}

// The spill write is asynchronous: a failed one is reported by the next
// Spill, or by the step's read-back, never lost.
TEST_F(WindowTest, AFailedSpillWriteFailsTheNextSpillAndTheReadBack) {
  auto failing = FailingWritesStore::Create("window-faults", kJob);
  ASSERT_NE(failing, nullptr);
  auto buffer = AlignedBuffer::Allocate(kPage, kPage);
  ASSERT_TRUE(buffer.ok());
  {
    auto spill = GradSpill::Create(kJob, failing->store.get(), kPage);
    ASSERT_TRUE(spill.ok()) << spill.status();
    EXPECT_TRUE((*spill)->Spill(0, 0, absl::Span<const std::byte>(buffer->data(), kPage)).ok());  // started
    absl::Status next = (*spill)->Spill(0, 1, absl::Span<const std::byte>(buffer->data(), kPage));
    EXPECT_FALSE(next.ok());
    EXPECT_NE(next.message().find("spilling the gradient of shard 0 of rank 0"), std::string::npos) << next;
  }
  {
    auto spill = GradSpill::Create(kJob, failing->store.get(), kPage);
    ASSERT_TRUE(spill.ok()) << spill.status();
    EXPECT_TRUE((*spill)->Spill(0, 2, absl::Span<const std::byte>(buffer->data(), kPage)).ok());
    (*spill)->BeginReadback({{ShardId{0, 2}, kPage}});
    auto got = (*spill)->Next(ShardId{0, 2});
    EXPECT_FALSE(got.ok());
    EXPECT_NE(got.status().message().find("shard 2"), std::string::npos) << got.status();
    (*spill)->EndReadback();
    (*spill)->DeleteAll();
  }
  EXPECT_NE(failing->faults.Summary().find("eio"), std::string::npos) << failing->faults.Summary();
}

}  // namespace
}  // namespace strata
