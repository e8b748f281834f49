// The step pipelines on their own (no daemon, no Job): which pipeline a mode
// gets and what it refuses; Offload's per-rank pinned footprint; and the
// Infinity window keeping gradients within its budget -- a gradient that does
// not fit is spilled to NVMe (its slot's memory given back) and comes back bit
// for bit, in step order, when the step asks for it.
#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/exchange_window.h"
#include "daemon/infinity_pipeline.h"
#include "daemon/job.h"
#include "daemon/offload_pipeline.h"
#include "daemon/pinned_budget.h"
#include "daemon/step_pipeline.h"
#include "gtest/gtest.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"
#include "swap/testing/scratch_extent_store.h"
#include "tiers/transfer_executor.h"

namespace strata {
namespace {

constexpr uint64_t kPage = 4096;

// Shards of `numel` fp16 elements each: one page per slot.
std::vector<ShardLayout> Shards(uint32_t count, uint64_t numel) {
  std::vector<ShardLayout> out;
  for (uint32_t i = 0; i < count; ++i) {
    ShardLayout s;
    s.index = i;
    s.padded_numel = numel;
    s.ranges.push_back(OwnedRange{TensorId(0), i * numel, numel, 0});
    out.push_back(std::move(s));
  }
  return out;
}

TEST(StepPipelineTest, TheModeChoosesThePipeline) {
  JobSettings settings;
  settings.mode = JobMode::kOffload;
  JobServices services;
  auto offload = MakeStepPipeline(1, settings, services);
  ASSERT_TRUE(offload.ok()) << offload.status();
  EXPECT_FALSE((*offload)->durable());
  EXPECT_FALSE((*offload)->windowed());
  EXPECT_TRUE((*offload)->early_apply());  // no loss scaling, no clipping
  settings.gradient_clipping = 1.0;
  auto clipped = MakeStepPipeline(1, settings, services);
  ASSERT_TRUE(clipped.ok());
  EXPECT_FALSE((*clipped)->early_apply());  // the update waits for every rank's norm

  settings.mode = JobMode::kInfinity;
  auto refused = MakeStepPipeline(1, settings, services);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--nvme_path"), std::string::npos) << refused.status();
}

TEST(StepPipelineTest, OffloadPinsTheRegionAndTheHostStates) {
  OffloadPipeline pipeline(/*early_apply=*/true);
  const std::vector<uint32_t> groups = {0};
  auto layout = LayOutExchange(Shards(3, 2048), SlotDTypes{DType::kFp16, DType::kFp16}, groups);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->region_bytes, 6 * kPage);  // a grad and a param page per shard
  StateLayout states;                          // Adam: master, exp_avg, exp_avg_sq
  states.exp_avg = true;
  states.exp_avg_sq = true;
  auto bytes = pipeline.RankPinnedBytes(0, *layout, states);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, 6 * kPage + 3 * (2048 * 3 * 4));
}

TEST(ExchangeLayoutTest, ARangeOfATensorWithoutAGroupIsRefusedNotIndexed) {
  const std::vector<uint32_t> groups = {0};  // one tensor; the shards below name tensor 0 only
  std::vector<ShardLayout> shards = Shards(2, 2048);
  shards[1].ranges[0].tensor = TensorId(1);
  auto layout = LayOutExchange(std::move(shards), SlotDTypes{DType::kFp16, DType::kFp16}, groups);
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(layout.status().message().find("shard 1 has a range of tensor 1; the job has 1 tensors"),
            std::string::npos)
      << layout.status();
}

class InfinityPipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto scratch = ScratchExtentStore::Create("pipeline", 16 << 20);
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    store_ = scratch_->store();
    auto workers = ThreadPoolExecutor::Create(1);
    ASSERT_TRUE(workers.ok());
    workers_ = std::move(*workers);
  }

  std::unique_ptr<ScratchExtentStore> scratch_;
  ExtentStore* store_ = nullptr;  // scratch_'s
  std::unique_ptr<ThreadPoolExecutor> workers_;
};

// ZeRO-Infinity steps shards early unless clipping needs every norm first;
// params and gradients of two element sizes too (the new params wait on
// NVMe, not over the gradient).
TEST_F(InfinityPipelineTest, ClippingKeepsEveryShardForTheStep) {
  JobSettings settings;
  settings.mode = JobMode::kInfinity;
  settings.param_dtype = DType::kFp16;
  settings.grad_dtype = DType::kFp16;
  settings.loss_scale.enabled = true;  // speculative: an overflow rolls the early shards back
  JobServices services;
  services.nvme = store_;
  auto early = MakeStepPipeline(1, settings, services);
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_TRUE((*early)->early_apply());
  settings.gradient_clipping = 1.0;
  auto clipped = MakeStepPipeline(1, settings, services);
  ASSERT_TRUE(clipped.ok());
  EXPECT_FALSE((*clipped)->early_apply());
  settings.gradient_clipping = 0;
  settings.grad_dtype = DType::kFp32;
  auto mixed = MakeStepPipeline(1, settings, services);
  ASSERT_TRUE(mixed.ok());
  EXPECT_TRUE((*mixed)->early_apply());
}

TEST_F(InfinityPipelineTest, AGradientOverTheBudgetIsSpilledAndComesBackBitForBit) {
  constexpr uint32_t kShards = 4;
  const SlotDTypes dtypes{DType::kFp16, DType::kFp16};
  // A budget of 1 byte is raised to the floor: two param slots and a gradient
  // (3 pages), so four one-page gradients cannot all stay.
  InfinityPipeline pipeline(/*job_id=*/9, "spill", /*world_size=*/1, dtypes, /*pinned_budget_bytes=*/1,
                            store_, /*pinned=*/nullptr);
  EXPECT_TRUE(pipeline.durable());
  EXPECT_TRUE(pipeline.windowed());
  EXPECT_FALSE(pipeline.early_apply());
  const std::vector<uint32_t> groups = {0};
  auto layout = LayOutExchange(Shards(kShards, 2048), dtypes, groups);
  ASSERT_TRUE(layout.ok()) << layout.status();
  ExchangeWindow window;
  ASSERT_TRUE(window.Map(std::move(*layout), "strata-pipeline-test", /*populate=*/false).ok());
  ExchangeRegions regions(dtypes);
  regions.Publish(0, 1, window);
  int rollbacks = 0;
  ASSERT_TRUE(pipeline.OpenWindow({&window.slots}, &regions, workers_.get(), [&] { ++rollbacks; }).ok());

  absl::Mutex job_mu;
  std::vector<std::vector<std::byte>> grads;
  std::mt19937 rng(5);
  for (uint32_t i = 0; i < kShards; ++i) {
    std::vector<std::byte> g(kPage);
    for (std::byte& b : g) b = static_cast<std::byte>(rng());
    std::memcpy(regions.GradSlot(0, window.slots[i]), g.data(), g.size());
    grads.push_back(std::move(g));
  }
  {
    absl::MutexLock lock(&job_mu);
    pipeline.AddRankLocked(job_mu, 0, 1, kShards);
    for (uint32_t i = 0; i < kShards; ++i) pipeline.GradArrivedLocked(job_mu, 0, i, window.slots[i]);
    for (uint32_t i = 0; i < kShards; ++i) {
      ASSERT_TRUE(pipeline.AfterInspectLocked(job_mu, 0, i, window.slots[i]).ok());
    }
    JobCounters counters;
    pipeline.CountLocked(job_mu, counters);
    EXPECT_EQ(counters.window_budget_bytes, 3 * kPage);
    // Two spilled: one for the budget, one more so the rank holds no more
    // than its keep -- the room (the whole budget, one rank) less a slot, so
    // the trainer's next gradient always has room (RankSession::WaitGradRoom).
    EXPECT_EQ(counters.grad_bytes_spilled, 2 * kPage);
    const GradWindow w = pipeline.GradWindowLocked(job_mu, 0);
    EXPECT_EQ(w.room, 3 * kPage);
    EXPECT_EQ(w.keep, 2 * kPage);
    EXPECT_EQ(w.held, 2 * kPage);
  }
  EXPECT_EQ(rollbacks, 0);

  // The step reads every gradient back in order: the spilled one from NVMe.
  std::vector<ShardId> ids;
  for (uint32_t i = 0; i < kShards; ++i) ids.push_back(ShardId{0, i});
  const std::vector<std::vector<ExchangeSlot>> slots = {window.slots};
  const StepHooks hooks = pipeline.BeginStep(job_mu, ids, slots);
  ASSERT_TRUE(hooks.grad_source && hooks.shard_done);
  for (uint32_t i = 0; i < kShards; ++i) {
    auto grad = hooks.grad_source(ids[i]);
    ASSERT_TRUE(grad.ok()) << grad.status();
    EXPECT_EQ(std::memcmp(*grad, grads[i].data(), kPage), 0) << "shard " << i;
    ASSERT_TRUE(hooks.shard_done(ids[i]).ok());
  }
  pipeline.EndStep(job_mu);
  absl::MutexLock lock(&job_mu);
  JobCounters counters;
  pipeline.CountLocked(job_mu, counters);
  EXPECT_EQ(counters.grad_bytes_read_back, 2 * kPage);
  EXPECT_EQ(pipeline.GradWindowLocked(job_mu, 0).held, 0u);  // the step took them all
  pipeline.CloseWindow();
}

// Issue 30.3: the window's reservation is the budget plus the staging; a
// pinned_budget_bytes near 2^64 wrapped that sum to a few pages, so the job
// reserved almost nothing against --pinned_capacity and then held up to its
// "budget" of pages. It is refused, naming the field, and reserves nothing.
TEST_F(InfinityPipelineTest, ABudgetThatWouldWrapTheWindowIsRefusedAndReservesNothing) {
  const SlotDTypes dtypes{DType::kFp16, DType::kFp16};
  PinnedBudget pinned(/*capacity_bytes=*/1 << 20);
  for (const bool early_apply : {false, true}) {
    InfinityPipeline pipeline(/*job_id=*/12, "wrap", /*world_size=*/1, dtypes,
                              /*pinned_budget_bytes=*/UINT64_MAX - 100, store_, &pinned, /*params=*/nullptr,
                              early_apply);
    const std::vector<uint32_t> groups = {0};
    auto layout = LayOutExchange(Shards(2, 2048), dtypes, groups);
    ASSERT_TRUE(layout.ok()) << layout.status();
    ExchangeWindow window;
    ASSERT_TRUE(window.Map(std::move(*layout), "strata-pipeline-test", /*populate=*/false).ok());
    ExchangeRegions regions(dtypes);
    regions.Publish(0, 1, window);
    absl::Status opened = pipeline.OpenWindow({&window.slots}, &regions, workers_.get(), [] {});
    ASSERT_FALSE(opened.ok()) << "a window of 2^64 - 100 bytes opened, reserving " << pinned.used() << " bytes";
    EXPECT_EQ(opened.code(), absl::StatusCode::kInvalidArgument) << opened;
    EXPECT_NE(opened.message().find("pinned_budget_bytes"), std::string::npos) << opened;
    EXPECT_EQ(pinned.used(), 0u);
    EXPECT_EQ(pipeline.pinned_bytes(), 0u);
  }
}

// What the job exports as its staging (JobInfo's nvme_tile_bytes and
// nvme_staging_bytes, read by bench/offload_parts) is the tile the NVMe
// store streams and the staging it holds.
TEST_F(InfinityPipelineTest, TheStagingItExportsIsTheTileItStreams) {
  const SlotDTypes dtypes{DType::kFp16, DType::kFp16};
  InfinityPipeline pipeline(/*job_id=*/10, "tiles", /*world_size=*/1, dtypes, /*pinned_budget_bytes=*/0, store_,
                            /*pinned=*/nullptr);
  StateLayout layout;  // AdamW: master, exp_avg, exp_avg_sq
  layout.exp_avg = true;
  layout.exp_avg_sq = true;
  constexpr uint64_t kTileBytes = 64 << 10;  // 16384 fp32 elements
  auto made = pipeline.MakeStates(layout, kTileBytes);
  ASSERT_TRUE(made.ok()) << made.status();
  ShardStateStore& states = **made;
  ASSERT_TRUE(states.Create(0, 0, 3000).ok());  // less than a tile: the staging is that shard's size
  EXPECT_EQ(states.staging().tile_bytes, kTileBytes);
  EXPECT_EQ(states.staging().bytes, 3 * 3 * 3072 * 4);  // 3 sets x 3 streams x RoundUp(3000, 1024)
  ASSERT_TRUE(states.Create(0, 1, 40000).ok());  // 2.4 tiles
  const StateStaging staging = states.staging();
  EXPECT_EQ(staging.tile_bytes, kTileBytes);
  EXPECT_EQ(staging.bytes, 3 * 3 * kTileBytes);

  uint64_t largest = 0, tiles = 0;
  ASSERT_TRUE(states
                  .Update({ShardId{0, 1}},
                          [&](const ShardId&, const StateTile& tile) {
                            largest = std::max(largest, tile.size);
                            ++tiles;
                            return absl::OkStatus();
                          })
                  .ok());
  EXPECT_EQ(largest * 4, staging.tile_bytes);
  EXPECT_EQ(tiles, 3u);
}

// Preload (the step's first gradient arrived): the first tiles are loaded
// ahead into the sets Update would use. Whatever follows -- the Update it
// was for, an Update of other shards (a skipped step's next one visits the
// same shards, a restored job others), a checkpoint's Read, a new shard's
// Create -- sees exactly the states on NVMe.
TEST_F(InfinityPipelineTest, PreloadedTilesAreTheStatesWhateverRunsNext) {
  const SlotDTypes dtypes{DType::kFp16, DType::kFp16};
  InfinityPipeline pipeline(/*job_id=*/11, "preload", /*world_size=*/1, dtypes, /*pinned_budget_bytes=*/0, store_,
                            /*pinned=*/nullptr);
  StateLayout layout;
  layout.exp_avg = true;
  layout.exp_avg_sq = true;
  auto made = pipeline.MakeStates(layout, /*tile_bytes=*/64 << 10);  // 16384 elements a tile
  ASSERT_TRUE(made.ok()) << made.status();
  ShardStateStore& states = **made;
  constexpr uint64_t kNumel = 40000;  // 3 tiles a shard
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(states.Create(0, i, kNumel).ok());
  // The states of shard i after `pass` passes: master = pass + i + e/1e5, exp_avg = -master.
  auto expect_and_write = [](int pass) {
    return [pass](const ShardId& id, const StateTile& tile) -> absl::Status {
      for (uint64_t e = 0; e < tile.size; ++e) {
        const float want = pass == 0 ? 0.0f : static_cast<float>(pass - 1 + id.index) + (tile.offset + e) * 1e-5f;
        if (tile.master[e] != want || tile.exp_avg[e] != -want) {
          return absl::InternalError(absl::StrCat("shard ", id.index, " element ", tile.offset + e, ": master ",
                                                  tile.master[e], " exp_avg ", tile.exp_avg[e], ", want ", want));
        }
        const float next = static_cast<float>(pass + id.index) + (tile.offset + e) * 1e-5f;
        tile.master[e] = next;
        tile.exp_avg[e] = -next;
      }
      return absl::OkStatus();
    };
  };
  const std::vector<ShardId> all = {ShardId{0, 0}, ShardId{0, 1}, ShardId{0, 2}};
  ASSERT_TRUE(states.Update(all, expect_and_write(0)).ok());
  // The preload the step uses.
  states.Preload(all);
  absl::Status s = states.Update(all, expect_and_write(1));
  ASSERT_TRUE(s.ok()) << s;
  // A preload of other shards first, then the step: discarded, still right.
  states.Preload({ShardId{0, 2}, ShardId{0, 1}});
  s = states.Update(all, expect_and_write(2));
  ASSERT_TRUE(s.ok()) << s;
  // A preload a second call does not restart, then a checkpoint's read.
  states.Preload(all);
  states.Preload({ShardId{0, 1}});
  s = states.Read({ShardId{0, 0}}, [](const ShardId&, const StateTile& tile) -> absl::Status {
    for (uint64_t e = 0; e < tile.size; ++e) {
      const float want = 2.0f + (tile.offset + e) * 1e-5f;
      if (tile.master[e] != want) return absl::InternalError(absl::StrCat("read ", tile.master[e], " want ", want));
    }
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  // A preload, then a new (larger) shard reallocating the staging, then the step.
  states.Preload(all);
  ASSERT_TRUE(states.Create(0, 3, 3 * kNumel).ok());
  s = states.Update(all, expect_and_write(3));
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace strata
