// Job::AcquireIn into the device tier, Park and Resume, on the daemon's one
// param store with an emulated device: shards served bit for bit from the
// device arena, a device budget smaller than the params while the job trains
// (eviction), parking in NVMe drops the window's pages and the device slots,
// Resume brings them back, and the errors name the fix.
#include <sys/mman.h>

#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/job.h"
#include "daemon/job_proto.h"
#include "daemon/job_settings.h"
#include "daemon/param_store.h"
#include "gtest/gtest.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"
#include "swap/testing/scratch_extent_store.h"
#include "daemon/job_device_tier.h"
#include "tiers/emulated_device.h"
#include "tiers/transfer_executor.h"

namespace strata {
namespace {

constexpr uint64_t kNumel = 16384;  // fp32: four shards of 4096 elements, 16 KiB each
constexpr uint64_t kShardBytes = 16384;
const absl::Duration kWait = absl::Seconds(30);

JobSettings Settings(const std::string& name, strata::v1::Mode mode, uint64_t device_budget) {
  strata::v1::CreateJobRequest r;
  r.set_name(name);
  r.set_world_size(1);
  r.set_mode(mode);
  r.set_device_budget_bytes(device_budget);
  r.set_pinned_budget_bytes(mode == strata::v1::MODE_INFINITY ? 3 * kShardBytes + kShardBytes : 0);
  r.set_deepspeed_config_json(absl::StrCat(
      R"({"zero_optimization": {"stage": )", mode == strata::v1::MODE_INFINITY ? 3 : 2,
      R"(, "sub_group_size": 4096}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"));
  auto s = ResolveJobSettings(r);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

class JobTiersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opt = CpuOptimizer::Create({});
    ASSERT_TRUE(opt.ok()) << opt.status();
    optimizer_ = std::move(*opt);
    auto scratch = ScratchExtentStore::Create("job_tiers", 64 << 20);
    ASSERT_TRUE(scratch.ok()) << scratch.status();
    scratch_ = std::move(*scratch);
    nvme_ = scratch_->store();
    EmulatedDeviceOptions device_options;
    device_options.capacity_bytes = 1 << 20;
    device_options.shared_memory = true;  // job arenas are memfds, as in the daemon
    auto device = EmulatedDevice::Create(device_options);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    JobDeviceTierOptions tier_options;
    tier_options.capacity_bytes = 1 << 20;
    auto tier = JobDeviceTier::Create(device_.get(), tier_options);
    ASSERT_TRUE(tier.ok()) << tier.status();
    device_tier_ = std::move(*tier);
    auto ps = ParamStore::Create(nvme_, device_tier_.get(), {});
    ASSERT_TRUE(ps.ok()) << ps.status();
    params_ = std::move(*ps);
    auto pool = ThreadPoolExecutor::Create(2);
    ASSERT_TRUE(pool.ok());
    workers_ = std::move(*pool);
  }
  void TearDown() override {
    for (auto& [base, bytes] : maps_) munmap(base, bytes);
  }

  JobServices Services() {
    JobServices services;
    services.optimizer = optimizer_.get();
    services.nvme = nvme_;
    services.workers = workers_.get();
    services.device = device_tier_.get();
    services.params = params_.get();
    return services;
  }

  // A registered, initialized job whose params the "trainer" wrote: shard i
  // element j holds 0.5 + i + j / 8192.
  std::unique_ptr<Job> MakeJob(uint64_t id, strata::v1::Mode mode, uint64_t device_budget) {
    auto job = Job::Create(id, Settings(absl::StrCat("job", id), mode, device_budget), Services());
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return nullptr;
    // Stage 3 shards by tensor, stage 2 by sub-group: four shards either way.
    std::vector<TensorSpec> tensors;
    for (uint32_t t = 0; t < 4; ++t) tensors.push_back(TensorSpec{TensorId(t), absl::StrCat("w", t), kNumel / 4});
    EXPECT_TRUE((*job)->Register(0, tensors).ok());
    std::byte* base = Map(**job);
    for (const ExchangeSlot& slot : (*job)->SlotsOf(0)) {
      float* p = reinterpret_cast<float*>(base + slot.param_offset);
      for (uint64_t j = 0; j < slot.layout.padded_numel; ++j) p[j] = 0.5f + slot.layout.index + j / 8192.0f;
    }
    EXPECT_TRUE((*job)->InitParams(0).ok());
    return std::move(*job);
  }

  // The rank's window, as the trainer maps it.
  std::byte* Map(Job& job) {
    const uint64_t bytes = job.ExchangeBytesOf(0);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, job.ExchangeFdOf(0), 0);
    EXPECT_NE(p, MAP_FAILED);
    maps_.emplace_back(p, bytes);
    return static_cast<std::byte*>(p);
  }

  std::vector<std::byte> DeviceCopy(uint64_t job, uint32_t index) {
    const ShardKey key{JobId(job), Rank(0), TensorId(index), TensorKind::kParam16, 0};
    auto lease = params_->store()->Acquire(key, TierKind::kDevice, AccessMode::kRead);
    EXPECT_TRUE(lease.ok()) << lease.status();
    std::vector<std::byte> out(kShardBytes);
    EXPECT_TRUE(params_->store()->ReadShard(*lease, absl::MakeSpan(out)).ok());
    EXPECT_TRUE(params_->store()->Release(lease->id, false).ok());
    return out;
  }

  std::unique_ptr<CpuOptimizer> optimizer_;
  std::unique_ptr<ScratchExtentStore> scratch_;
  ExtentStore* nvme_ = nullptr;  // scratch_'s
  std::unique_ptr<EmulatedDevice> device_;
  std::unique_ptr<JobDeviceTier> device_tier_;
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<ThreadPoolExecutor> workers_;
  std::vector<std::pair<void*, uint64_t>> maps_;
};

TEST_F(JobTiersTest, ADeviceBudgetBelowTheParamsTrainsAndServesEveryShardBitForBit) {
  auto job = MakeJob(1, strata::v1::MODE_INFINITY, 2 * kShardBytes);  // half the params
  ASSERT_NE(job, nullptr);
  std::byte* window = Map(*job);
  const std::vector<ExchangeSlot> slots = job->SlotsOf(0);
  ASSERT_EQ(slots.size(), 4u);
  for (uint64_t step = 0; step < 3; ++step) {
    // Forward: every shard from the device, one at a time; then the same
    // shard in the window must hold the same bytes.
    for (const ExchangeSlot& slot : slots) {
      const uint32_t i = slot.layout.index;
      auto places = job->AcquireIn(0, {i}, TierKind::kDevice, absl::Now() + kWait);
      ASSERT_TRUE(places.ok()) << places.status();
      ASSERT_EQ(places->size(), 1u);
      EXPECT_EQ((*places)[0].tier, TierKind::kDevice);
      EXPECT_EQ((*places)[0].bytes, kShardBytes);
      const std::vector<std::byte> on_device = DeviceCopy(1, i);
      ASSERT_TRUE(job->Acquire(0, {i}, absl::Now() + kWait).ok());
      ASSERT_EQ(std::memcmp(on_device.data(), window + slot.param_offset, kShardBytes), 0)
          << "step " << step << " shard " << i;
      if (step == 0) {
        EXPECT_EQ(reinterpret_cast<const float*>(on_device.data())[1], 0.5f + i + 1 / 8192.0f);
      }
      ASSERT_TRUE(job->Release(0, {i, i}).ok());
      EXPECT_LE(params_->store()->job_charged_bytes(JobId(1), TierKind::kDevice), 2 * kShardBytes);
    }
    ASSERT_TRUE(job->IterationBoundary(0).ok());
    // Backward: every gradient 0.25.
    for (const ExchangeSlot& slot : slots) {
      float* g = reinterpret_cast<float*>(window + slot.grad_offset);
      for (uint64_t j = 0; j < slot.layout.padded_numel; ++j) g[j] = 0.25f;
      ASSERT_TRUE(job->GradReady(0, slot.layout.index, step).ok());
    }
    auto outcome = job->WaitStep(step, absl::Now() + kWait);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    EXPECT_FALSE(outcome->skipped);
  }
  // Trained: the params moved, and the device serves the new ones.
  auto places = job->AcquireIn(0, {2}, TierKind::kDevice, absl::Now() + kWait);
  ASSERT_TRUE(places.ok()) << places.status();
  const std::vector<std::byte> now = DeviceCopy(1, 2);
  EXPECT_NE(reinterpret_cast<const float*>(now.data())[1], 0.5f + 2 + 1 / 8192.0f);
  ASSERT_TRUE(job->Release(0, {2}).ok());
  EXPECT_GT(params_->store()->job_stats(JobId(1)).tier(TierKind::kDevice).evictions, 0u);
  EXPECT_TRUE(params_->store()->CheckInvariants().ok()) << params_->store()->CheckInvariants();
}

TEST_F(JobTiersTest, ParkInNvmeDropsTheWindowAndTheDeviceAndResumeBringsThemBack) {
  auto job = MakeJob(2, strata::v1::MODE_INFINITY, 4 * kShardBytes);
  ASSERT_NE(job, nullptr);
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(job->AcquireIn(0, {i}, TierKind::kDevice, absl::Now() + kWait).ok());
  }
  auto refused = job->Park(TierKind::kNvme);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("rank 0"), std::string::npos) << refused.status();
  ASSERT_TRUE(job->Release(0, {0, 1, 2}).ok());
  std::vector<std::vector<std::byte>> before;
  for (uint32_t i = 0; i < 3; ++i) before.push_back(DeviceCopy(2, i));
  const uint64_t window_before = job->counters().window_resident_bytes;
  auto parked = job->Park(TierKind::kNvme);
  ASSERT_TRUE(parked.ok()) << parked.status();
  EXPECT_EQ(parked->tier, TierKind::kNvme);
  EXPECT_GE(parked->shards, 3u);
  EXPECT_EQ(job->counters().window_resident_bytes, 0u);  // the window's pages went back
  EXPECT_EQ(device_tier_->used_bytes(), 0u);
  auto resumed = job->Resume();
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->tier, TierKind::kDevice);
  EXPECT_GE(resumed->bytes_moved, 3 * kShardBytes);
  EXPECT_EQ(device_tier_->used_bytes(), 3 * kShardBytes);
  EXPECT_EQ(job->counters().window_resident_bytes, window_before);
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(DeviceCopy(2, i), before[i]) << "shard " << i;
}

TEST_F(JobTiersTest, ErrorsNameTheFix) {
  auto no_budget = MakeJob(3, strata::v1::MODE_INFINITY, 0);
  ASSERT_NE(no_budget, nullptr);
  auto got = no_budget->AcquireIn(0, {0}, TierKind::kDevice, absl::Now() + kWait);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(got.status().message().find("device_budget_bytes"), std::string::npos) << got.status();

  auto small = MakeJob(4, strata::v1::MODE_INFINITY, kShardBytes);
  ASSERT_NE(small, nullptr);
  got = small->AcquireIn(0, {0, 1}, TierKind::kDevice, absl::Now() + kWait);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
  EXPECT_NE(got.status().message().find("16.0 KiB"), std::string::npos) << got.status();
  EXPECT_EQ(small->AcquireIn(0, {9}, TierKind::kDevice, absl::Now() + kWait).status().code(),
            absl::StatusCode::kOutOfRange);

  auto offload = MakeJob(5, strata::v1::MODE_OFFLOAD, kShardBytes);
  ASSERT_NE(offload, nullptr);
  got = offload->AcquireIn(0, {0}, TierKind::kDevice, absl::Now() + kWait);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(got.status().message().find("Offload"), std::string::npos) << got.status();
  auto park = offload->Park(TierKind::kNvme);
  EXPECT_EQ(park.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(park.status().message().find("Offload"), std::string::npos) << park.status();
  EXPECT_EQ(offload->Resume().status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace strata
