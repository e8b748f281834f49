// ZeRO-Infinity steps a shard as soon as its gradient is inspected (with
// the others inspected meanwhile, in one pass), while the trainer is still
// sending the rest (no clipping). Under fp16 loss scaling that is speculation on the step not
// overflowing: an overflow in a gradient sent after some shards were stepped
// skips the step, and the job rolls their states back, so it trains the same
// bits as a job whose step waits for every gradient.
//
// The reference job has clipping with a bound no norm reaches: it waits for
// every gradient (the clip coefficient needs them all), and its coefficient
// is exactly 1, so its updates are the same arithmetic. The jobs run in
// process over a scratch extent store with 4 KiB state tiles, so a shard of
// 4096 elements streams as four tiles (the daemon's tiles are 64 MiB).
#include <sys/mman.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "daemon/job.h"
#include "daemon/job_proto.h"
#include "daemon/job_settings.h"
#include "daemon/param_store.h"
#include "gtest/gtest.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "optimizer_cpu/half.h"
#include "swap/testing/scratch_extent_store.h"
#include "tiers/transfer_executor.h"

namespace strata {
namespace {

constexpr uint32_t kShards = 4;
constexpr uint64_t kNumel = 4096;  // per shard: 4 tiles of 1024 fp32 state elements
constexpr int kSteps = 4;
constexpr int kOverflowStep = 1;  // its last gradient (shard 0) holds an inf
const absl::Duration kWait = absl::Seconds(30);

JobSettings Settings(const std::string& name, const std::string& clipping, const std::string& grad_dtype = "fp16") {
  strata::v1::CreateJobRequest r;
  r.set_name(name);
  r.set_world_size(1);
  r.set_mode(strata::v1::MODE_INFINITY);
  r.set_param_dtype("fp16");
  r.set_grad_dtype(grad_dtype);
  r.set_pinned_budget_bytes(1 << 20);
  r.set_deepspeed_config_json(absl::StrCat(
      R"({"gradient_clipping": )", clipping,
      R"(, "zero_optimization": {"stage": 3}, "fp16": {"enabled": true, "initial_scale_power": 4},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}})"));
  auto s = ResolveJobSettings(r);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

float Initial(uint64_t t, uint64_t e) { return std::sin(0.001f * static_cast<float>(e + 1) + static_cast<float>(t)); }
// Loss-scaled (the scale starts at 2^4).
float Grad(uint64_t t, uint64_t e, int step) {
  return 1.6f * std::cos(0.01f * static_cast<float>(e) + static_cast<float>(t) + 0.5f * static_cast<float>(step));
}

class JobEarlyStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opt = CpuOptimizer::Create({});
    ASSERT_TRUE(opt.ok()) << opt.status();
    optimizer_ = std::move(*opt);
    auto scratch = ScratchExtentStore::Create("job_early_step", 64 << 20);
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    auto ps = ParamStore::Create(scratch_->store(), nullptr, {});
    ASSERT_TRUE(ps.ok()) << ps.status();
    params_ = std::move(*ps);
    auto pool = ThreadPoolExecutor::Create(2);
    ASSERT_TRUE(pool.ok());
    workers_ = std::move(*pool);
  }
  void TearDown() override {
    jobs_.clear();
    for (auto& [base, bytes] : maps_) munmap(base, bytes);
  }

  // A registered job with shards of `numel` elements whose params are
  // Initial(shard, element); returns it and its rank's window.
  std::pair<Job*, std::byte*> MakeJob(uint64_t id, const std::string& clipping, uint64_t numel = kNumel,
                                      const std::string& grad_dtype = "fp16") {
    JobServices services;
    services.optimizer = optimizer_.get();
    services.nvme = scratch_->store();
    services.workers = workers_.get();
    services.params = params_.get();
    services.io_tile_bytes = 4096;
    services.early_pass_wait = early_pass_wait_;
    auto job = Job::Create(id, Settings(absl::StrCat("job", id), clipping, grad_dtype), services);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return {nullptr, nullptr};
    std::vector<TensorSpec> tensors;
    for (uint32_t t = 0; t < kShards; ++t) tensors.push_back(TensorSpec{TensorId(t), absl::StrCat("w", t), numel});
    EXPECT_TRUE((*job)->Register(0, tensors).ok());
    const uint64_t bytes = (*job)->ExchangeBytesOf(0);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, (*job)->ExchangeFdOf(0), 0);
    EXPECT_NE(p, MAP_FAILED);
    maps_.emplace_back(p, bytes);
    std::byte* window = static_cast<std::byte*>(p);
    for (const ExchangeSlot& slot : (*job)->SlotsOf(0)) Fill(window + slot.param_offset, slot, Initial);
    EXPECT_TRUE((*job)->InitParams(0).ok());
    jobs_.push_back(std::move(*job));
    return {jobs_.back().get(), window};
  }

  template <typename Fn>
  static void Fill(std::byte* at, const ExchangeSlot& slot, Fn value) {
    uint16_t* out = reinterpret_cast<uint16_t*>(at);
    for (uint64_t e = 0; e < slot.layout.padded_numel; ++e) out[e] = Fp32ToFp16Bits(value(slot.layout.index, e));
  }

  // Waits until the job has stepped `n` shards early; false on timeout.
  static bool WaitForEarly(Job& job, uint64_t n) {
    for (int k = 0; k < 3000; ++k) {
      if (job.counters().shards_stepped_early >= n) return true;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return false;
  }

  struct TrainRun {
    std::vector<std::vector<uint16_t>> params_seen;  // per step and shard, as forward read them
    std::vector<bool> skipped;
  };

  // Forward reads every shard; backward sends the gradients in reverse.
  // `early`: after each gradient but the step's last, wait until the job
  // stepped that shard (so step kOverflowStep's inf comes after three shards
  // were stepped, not before).
  void Train(Job& job, std::byte* window, bool early, TrainRun* out) {
    const std::vector<ExchangeSlot> slots = job.SlotsOf(0);
    uint64_t stepped = 0;
    auto read_params = [&] {
      for (const ExchangeSlot& slot : slots) {
        ASSERT_TRUE(job.Acquire(0, {slot.layout.index}, absl::Now() + kWait).ok());
        const uint16_t* p = reinterpret_cast<const uint16_t*>(window + slot.param_offset);
        out->params_seen.emplace_back(p, p + kNumel);
        ASSERT_TRUE(job.Release(0, {slot.layout.index}).ok());
      }
    };
    for (int step = 0; step < kSteps; ++step) {
      read_params();
      ASSERT_TRUE(job.IterationBoundary(0).ok());
      for (uint32_t i = kShards; i-- > 0;) {
        const ExchangeSlot& slot = slots[i];
        Fill(window + slot.grad_offset, slot, [step](uint64_t t, uint64_t e) { return Grad(t, e, step); });
        if (step == kOverflowStep && i == 0) reinterpret_cast<uint16_t*>(window + slot.grad_offset)[7] = 0x7c00;
        ASSERT_TRUE(job.GradReady(0, i, step).ok());
        if (!early || i == 0) continue;
        ASSERT_TRUE(WaitForEarly(job, ++stepped)) << "step " << step << " shard " << i << " was not stepped early";
      }
      auto outcome = job.WaitStep(step, absl::Now() + kWait);
      ASSERT_TRUE(outcome.ok()) << outcome.status();
      out->skipped.push_back(outcome->skipped);
    }
    read_params();
  }

  // The job that waits for every gradient: step 0 with `grad`, in reverse.
  template <typename Fn>
  static void StepWaiting(Job& waits, std::byte* window, Fn grad) {
    const std::vector<ExchangeSlot> slots = waits.SlotsOf(0);
    for (uint32_t i = kShards; i-- > 0;) {
      Fill(window + slots[i].grad_offset, slots[i], grad);
      ASSERT_TRUE(waits.GradReady(0, i, 0).ok());
    }
    auto waited = waits.WaitStep(0, absl::Now() + kWait);
    ASSERT_TRUE(waited.ok()) << waited.status();
    EXPECT_EQ(waits.counters().shards_stepped_early, 0u);
  }

  // Sends shard `index`'s gradient (step 0) to job `id` and waits until its
  // new params wait on NVMe under their pending key: the pass stepped it and
  // waits for the next shard.
  template <typename Fn>
  void SendAndWaitForItsPendingParams(Job& job, std::byte* window, uint64_t id, uint32_t index, Fn grad) {
    const ExchangeSlot slot = job.SlotsOf(0)[index];
    Fill(window + slot.grad_offset, slot, grad);
    ASSERT_TRUE(job.GradReady(0, index, 0).ok());
    const ShardKey pending{JobId(id), Rank(0), TensorId(index), TensorKind::kParam16, 1};
    for (int k = 0; k < 3000 && !scratch_->store()->Contains(pending); ++k) absl::SleepFor(absl::Milliseconds(2));
    ASSERT_TRUE(scratch_->store()->Contains(pending));
  }

  // Every shard's params, as an acquire reads them, are the same bits in
  // both jobs, and moved from their initial values.
  static void ExpectSameParams(Job& job, std::byte* window, Job& waits, std::byte* waits_window, uint64_t numel) {
    const std::vector<ExchangeSlot> slots = job.SlotsOf(0);
    const std::vector<ExchangeSlot> waits_slots = waits.SlotsOf(0);
    for (uint32_t i = 0; i < kShards; ++i) {
      ASSERT_TRUE(job.Acquire(0, {i}, absl::Now() + kWait).ok());
      ASSERT_TRUE(waits.Acquire(0, {i}, absl::Now() + kWait).ok());
      EXPECT_EQ(std::memcmp(window + slots[i].param_offset, waits_window + waits_slots[i].param_offset, numel * 2), 0)
          << "shard " << i;
      EXPECT_NE(reinterpret_cast<const uint16_t*>(window + slots[i].param_offset)[5], Fp32ToFp16Bits(Initial(i, 5)))
          << "shard " << i << " did not move";
      ASSERT_TRUE(job.Release(0, {i}).ok());
      ASSERT_TRUE(waits.Release(0, {i}).ok());
    }
  }

  // The jobs' (JobServices::early_pass_wait).
  absl::Duration early_pass_wait_ = absl::Milliseconds(200);
  std::unique_ptr<CpuOptimizer> optimizer_;
  std::unique_ptr<ScratchExtentStore> scratch_;
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<ThreadPoolExecutor> workers_;
  std::vector<std::unique_ptr<Job>> jobs_;
  std::vector<std::pair<void*, uint64_t>> maps_;
};

TEST_F(JobEarlyStepTest, ShardsSteppedEarlyTrainTheSameBitsAndAnOverflowRollsThemBack) {
  auto [early_job, early_window] = MakeJob(1, "0");
  auto [waits_job, waits_window] = MakeJob(2, "1e30");
  ASSERT_NE(early_job, nullptr);
  ASSERT_NE(waits_job, nullptr);
  TrainRun early, waits;
  Train(*early_job, early_window, /*early=*/true, &early);
  if (HasFatalFailure()) return;
  Train(*waits_job, waits_window, /*early=*/false, &waits);
  if (HasFatalFailure()) return;
  // Every gradient but each step's last was stepped early; the overflowed
  // step's three were rolled back.
  EXPECT_EQ(early_job->counters().shards_stepped_early, (kShards - 1) * kSteps);
  EXPECT_EQ(early_job->counters().last_step.shards_early, kShards - 1);
  EXPECT_EQ(early_job->counters().last_step.early_passes, kShards - 1);  // the trainer waited for each
  EXPECT_EQ(waits_job->counters().shards_stepped_early, 0u);
  const std::vector<bool> expected_skips = {false, true, false, false};
  EXPECT_EQ(early.skipped, expected_skips);
  EXPECT_EQ(waits.skipped, expected_skips);
  ASSERT_EQ(early.params_seen.size(), waits.params_seen.size());
  for (size_t i = 0; i < early.params_seen.size(); ++i) {
    ASSERT_EQ(early.params_seen[i], waits.params_seen[i]) << "step " << i / kShards << " shard " << i % kShards;
  }
  // The params do move, and the skipped step moved none.
  EXPECT_NE(early.params_seen[0], early.params_seen[kShards]);
  for (uint32_t i = 0; i < kShards; ++i) {
    EXPECT_EQ(early.params_seen[kShards + i], early.params_seen[2 * kShards + i]) << "shard " << i;
  }
}

// Shards of one state tile, inspected while the job's worker was busy, are
// stepped early together, in one pass over their states (a pass per shard
// would overlap none of their loads and saves), and train the same bits as
// the job that waits for every gradient.
TEST_F(JobEarlyStepTest, ShardsInspectedTogetherAreSteppedInOnePass) {
  constexpr uint64_t kOneTile = 1024;
  auto [job, window] = MakeJob(3, "0", kOneTile);
  auto [waits, waits_window] = MakeJob(5, "1e30", kOneTile);
  ASSERT_NE(job, nullptr);
  ASSERT_NE(waits, nullptr);
  auto grad = [](uint64_t t, uint64_t e) { return Grad(t, e, 0); };
  // Both workers of the jobs' pool held: the three gradients' inspections
  // queue behind each other, and the pass they queue comes after all three.
  absl::Notification release;
  absl::BlockingCounter held(2);
  for (int i = 0; i < 2; ++i) {
    workers_->Schedule([&] {
      held.DecrementCount();
      release.WaitForNotification();
    });
  }
  held.Wait();
  const std::vector<ExchangeSlot> slots = job->SlotsOf(0);
  for (uint32_t i = kShards; i-- > 1;) {
    Fill(window + slots[i].grad_offset, slots[i], grad);
    ASSERT_TRUE(job->GradReady(0, i, 0).ok());
  }
  release.Notify();
  ASSERT_TRUE(WaitForEarly(*job, kShards - 1));
  EXPECT_EQ(job->counters().early_passes, 1u);
  Fill(window + slots[0].grad_offset, slots[0], grad);
  ASSERT_TRUE(job->GradReady(0, 0, 0).ok());
  auto outcome = job->WaitStep(0, absl::Now() + kWait);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_FALSE(outcome->skipped);
  EXPECT_EQ(job->counters().last_step.shards_early, kShards - 1);
  EXPECT_EQ(job->counters().last_step.early_passes, 1u);
  StepWaiting(*waits, waits_window, grad);
  if (HasFatalFailure()) return;
  ExpectSameParams(*job, window, *waits, waits_window, kOneTile);
}

// A shard stepped early gives its gradient slot back at once: its new params
// wait on NVMe under a key of their own, the home (what an acquire reads)
// stays the old params until the step starts, and then the pending version
// becomes the home's without a copy. A trainer that writes the slot again
// after GradReady (re-sending the gradient, which the barrier ignores as a
// duplicate) changes nothing: the job trains the same bits as the job that
// waits.
TEST_F(JobEarlyStepTest, AShardSteppedEarlyFreesItsSlotAndItsParamsWaitOnNvme) {
  auto [job, window] = MakeJob(4, "0");
  auto [waits, waits_window] = MakeJob(6, "1e30");
  ASSERT_NE(job, nullptr);
  ASSERT_NE(waits, nullptr);
  const std::vector<ExchangeSlot> slots = job->SlotsOf(0);
  auto grad = [](uint64_t t, uint64_t e) { return Grad(t, e, 0); };
  const uint32_t first = kShards - 1;
  const ExchangeSlot& last = slots[first];
  const ShardKey pending{JobId(4), Rank(0), TensorId(first), TensorKind::kParam16, 1};
  Fill(window + last.grad_offset, last, grad);
  ASSERT_TRUE(job->GradReady(0, first, 0).ok());
  ASSERT_TRUE(WaitForEarly(*job, 1));
  // The slot's memory went back (a punched page reads as zeros) and the new
  // params are on NVMe, not yet the home.
  const uint16_t* grad_slot = reinterpret_cast<const uint16_t*>(window + last.grad_offset);
  for (uint64_t e = 0; e < kNumel; e += 512) EXPECT_EQ(grad_slot[e], 0u) << "element " << e;
  EXPECT_TRUE(scratch_->store()->Contains(pending));
  ASSERT_TRUE(job->Acquire(0, {first}, absl::Now() + kWait).ok());
  EXPECT_EQ(reinterpret_cast<const uint16_t*>(window + last.param_offset)[5], Fp32ToFp16Bits(Initial(first, 5)));
  ASSERT_TRUE(job->Release(0, {first}).ok());
  // Sent again: a duplicate, whatever the slot holds now.
  Fill(window + last.grad_offset, last, [](uint64_t t, uint64_t e) { return 3 * Grad(t, e, 1); });
  ASSERT_TRUE(job->GradReady(0, first, 0).ok());
  for (uint32_t i = first; i-- > 0;) {
    Fill(window + slots[i].grad_offset, slots[i], grad);
    ASSERT_TRUE(job->GradReady(0, i, 0).ok());
  }
  auto outcome = job->WaitStep(0, absl::Now() + kWait);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_FALSE(outcome->skipped);
  EXPECT_FALSE(scratch_->store()->Contains(pending));  // renamed onto the home
  StepWaiting(*waits, waits_window, grad);
  if (HasFatalFailure()) return;
  ExpectSameParams(*job, window, *waits, waits_window, kNumel);
}

// fp16 params with fp32 gradients (elements of two sizes) are stepped early
// as well -- the new params never go over the gradient -- and train the same
// bits as the job that waits.
TEST_F(JobEarlyStepTest, Fp32GradientsForFp16ParamsAreSteppedEarlyToo) {
  auto [job, window] = MakeJob(7, "0", kNumel, "fp32");
  auto [waits, waits_window] = MakeJob(8, "1e30", kNumel, "fp32");
  ASSERT_NE(job, nullptr);
  ASSERT_NE(waits, nullptr);
  auto send = [](Job& j, std::byte* w, bool early) {
    const std::vector<ExchangeSlot> slots = j.SlotsOf(0);
    for (uint32_t i = kShards; i-- > 0;) {
      float* g = reinterpret_cast<float*>(w + slots[i].grad_offset);
      for (uint64_t e = 0; e < slots[i].layout.padded_numel; ++e) g[e] = Grad(i, e, 0);
      ASSERT_TRUE(j.GradReady(0, i, 0).ok());
      if (early && i > 0) {
        ASSERT_TRUE(WaitForEarly(j, kShards - i));
      }
    }
    auto outcome = j.WaitStep(0, absl::Now() + kWait);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_FALSE(outcome->skipped);
  };
  send(*job, window, true);
  if (HasFatalFailure()) return;
  send(*waits, waits_window, false);
  if (HasFatalFailure()) return;
  EXPECT_EQ(job->counters().last_step.shards_early, kShards - 1);
  ExpectSameParams(*job, window, *waits, waits_window, kNumel);
}

// A pass stepping shards goes on with the gradients that come in while it
// runs and, once the last is in, with every shard the step has left: the
// early shards and the step's are one stream over the states (one first
// load, one drain), and the step is left to rename the new params onto their
// homes and commit. It trains the same bits as the job that waits.
TEST_F(JobEarlyStepTest, OnePassStepsTheGradientsThatComeWhileItRunsAndTheRest) {
  early_pass_wait_ = absl::Seconds(30);  // the sends below always come in time
  auto [job, window] = MakeJob(9, "0");
  auto [waits, waits_window] = MakeJob(10, "1e30");
  ASSERT_NE(job, nullptr);
  ASSERT_NE(waits, nullptr);
  const std::vector<ExchangeSlot> slots = job->SlotsOf(0);
  auto grad = [](uint64_t t, uint64_t e) { return Grad(t, e, 0); };
  const uint32_t first = kShards - 1;
  SendAndWaitForItsPendingParams(*job, window, 9, first, grad);
  if (HasFatalFailure()) return;
  const ShardKey pending{JobId(9), Rank(0), TensorId(first), TensorKind::kParam16, 1};
  for (uint32_t i = first; i-- > 0;) {
    Fill(window + slots[i].grad_offset, slots[i], grad);
    ASSERT_TRUE(job->GradReady(0, i, 0).ok());
  }
  auto outcome = job->WaitStep(0, absl::Now() + kWait);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_FALSE(outcome->skipped);
  const StepTimes last = job->counters().last_step;
  EXPECT_EQ(last.shards_early, kShards);
  EXPECT_EQ(last.early_passes, 1u);
  // The pass's time is the early breakdown's, and its parts fit in it.
  EXPECT_GT(last.early_stream_s, 0);
  EXPECT_GE(last.early_load_wait_s, 0);
  EXPECT_GE(last.early_params_home_s, 0);
  EXPECT_LE(last.early_load_wait_s + last.early_params_home_s, last.early_stream_s);
  EXPECT_FALSE(scratch_->store()->Contains(pending));  // renamed onto the home
  // The last gradient's shard was stepped once the step was certain: its
  // new params went home the way the step's own pass stores them, kept in
  // the window (the budget has room), so acquiring it reads nothing.
  const ParamCacheStats before = job->counters().params;
  ASSERT_TRUE(job->Acquire(0, {0}, absl::Now() + kWait).ok());
  ASSERT_TRUE(job->Release(0, {0}).ok());
  EXPECT_EQ(job->counters().params.hits, before.hits + 1);
  EXPECT_EQ(job->counters().params.misses, before.misses);
  StepWaiting(*waits, waits_window, grad);
  if (HasFatalFailure()) return;
  ExpectSameParams(*job, window, *waits, waits_window, kNumel);
}

// The pass ends at a gradient that overflowed: the step is skipped, the
// shards the pass stepped are rolled back, and their new params, which never
// became the homes, are gone from NVMe.
TEST_F(JobEarlyStepTest, AnOverflowEndsThePassAndItsShardsAreRolledBack) {
  early_pass_wait_ = absl::Seconds(30);
  auto [job, window] = MakeJob(11, "0");
  ASSERT_NE(job, nullptr);
  const std::vector<ExchangeSlot> slots = job->SlotsOf(0);
  auto grad = [](uint64_t t, uint64_t e) { return Grad(t, e, 0); };
  const uint32_t first = kShards - 1;
  auto pending = [](uint32_t index) { return ShardKey{JobId(11), Rank(0), TensorId(index), TensorKind::kParam16, 1}; };
  SendAndWaitForItsPendingParams(*job, window, 11, first, grad);
  if (HasFatalFailure()) return;
  for (uint32_t i = first; i-- > 0;) {
    Fill(window + slots[i].grad_offset, slots[i], grad);
    if (i == 0) reinterpret_cast<uint16_t*>(window + slots[i].grad_offset)[7] = 0x7c00;  // inf
    ASSERT_TRUE(job->GradReady(0, i, 0).ok());
  }
  auto outcome = job->WaitStep(0, absl::Now() + kWait);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_TRUE(outcome->skipped);
  EXPECT_EQ(job->counters().last_step.shards_early, 0u);  // a skipped step keeps the last breakdown
  EXPECT_EQ(job->counters().early_passes, 1u);
  // The first, and those inspected before the last gradient came in (its
  // send may beat their inspections); never the overflowed one.
  EXPECT_GE(job->counters().shards_stepped_early, 1u);
  EXPECT_LT(job->counters().shards_stepped_early, kShards);
  for (uint32_t i = 0; i < kShards; ++i) {
    EXPECT_FALSE(scratch_->store()->Contains(pending(i))) << "shard " << i;
    ASSERT_TRUE(job->Acquire(0, {i}, absl::Now() + kWait).ok());
    const uint16_t* p = reinterpret_cast<const uint16_t*>(window + slots[i].param_offset);
    for (uint64_t e = 0; e < kNumel; e += 511) {
      ASSERT_EQ(p[e], Fp32ToFp16Bits(Initial(i, e))) << "shard " << i << " element " << e;
    }
    ASSERT_TRUE(job->Release(0, {i}).ok());
  }
}

}  // namespace
}  // namespace strata
