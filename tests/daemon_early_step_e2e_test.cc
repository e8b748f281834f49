// ZeRO-Infinity steps a shard as soon as its gradient is inspected, while
// the trainer is still sending the others (no clipping). Under fp16 loss
// scaling that is speculation on the step not overflowing: an overflow in a
// gradient sent after some shards were stepped skips the step, and the
// daemon rolls those shards' states back, so the job trains the same bits as
// one whose step waits for every gradient.
//
// The reference job has clipping with a bound no norm reaches: it waits for
// every gradient (the clip coefficient needs them all), and its coefficient
// is exactly 1, so its updates are the same arithmetic.

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "optimizer_cpu/half.h"
#include "tests/daemon_fixture.h"

namespace strata {
namespace {

constexpr uint32_t kTensors = 4;
constexpr uint64_t kNumel = 4096;  // 8 KiB of fp16 per slot
constexpr int kSteps = 4;
constexpr int kOverflowStep = 1;   // its last gradient (shard 0) holds an inf

JobSpec Spec(const std::string& name, const std::string& clipping) {
  JobSpec spec;
  spec.name = name;
  spec.world_size = 1;
  spec.mode = JobMode::kInfinity;
  spec.deepspeed_config_json = absl::StrCat(
      R"({"gradient_clipping": )", clipping,
      R"(, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"},
          "offload_optimizer": {"device": "nvme"}}, "fp16": {"enabled": true, "initial_scale_power": 4},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}})");
  spec.param_dtype = DType::kFp16;
  spec.grad_dtype = DType::kFp16;
  spec.pinned_budget_bytes = 1 << 20;
  return spec;
}

float Initial(uint64_t t, uint64_t e) { return std::sin(0.001f * static_cast<float>(e + 1) + static_cast<float>(t)); }
float Grad(uint64_t t, uint64_t e, int step) {
  // Loss-scaled (the scale starts at 2^4).
  return 16.0f * 0.1f * std::cos(0.01f * static_cast<float>(e) + static_cast<float>(t) + 0.5f * static_cast<float>(step));
}

template <typename Fn>
void Fill16(const ShardView& shard, std::byte* base, Fn value) {
  uint16_t* out = reinterpret_cast<uint16_t*>(base);
  for (const OwnedRange& r : shard.ranges) {
    for (uint64_t e = 0; e < r.numel; ++e) {
      out[r.shard_offset + e] = Fp32ToFp16Bits(value(r.tensor.value(), r.tensor_offset + e));
    }
  }
}

absl::StatusOr<JobSummary> Find(StrataClient& client, const std::string& name) {
  auto jobs = client.ListJobs();
  if (!jobs.ok()) return jobs.status();
  for (const JobSummary& j : *jobs) {
    if (j.name == name) return j;
  }
  return absl::NotFoundError(name);
}

struct TrainRun {
  std::vector<std::vector<uint16_t>> params_seen;  // per step and shard, as forward read them
  std::vector<bool> skipped;
  uint64_t stepped_early = 0;
  uint64_t last_step_early = 0;
};

// `early`: wait, after each gradient but the step's last, until the daemon
// has stepped that shard (so the overflow of kOverflowStep comes after
// shards were stepped, not before).
void Train(StrataClient& client, const std::string& name, bool early, TrainRun* out) {
  auto session = client.Attach(name, 0);
  ASSERT_TRUE(session.ok()) << session.status();
  RankSession& rank = **session;
  std::vector<TensorDesc> model;
  for (uint32_t t = 0; t < kTensors; ++t) model.push_back({absl::StrCat("layer", t), kNumel});
  ASSERT_TRUE(rank.RegisterTensors(model).ok());
  ASSERT_EQ(rank.shards().size(), kTensors);
  for (ShardView& shard : rank.shards()) Fill16(shard, shard.param, Initial);
  ASSERT_TRUE(rank.InitParams().ok());
  uint64_t early_so_far = 0;
  for (int step = 0; step < kSteps; ++step) {
    for (uint32_t i = 0; i < kTensors; ++i) {
      ASSERT_TRUE(rank.Acquire({i}).ok());
      const uint16_t* p = reinterpret_cast<const uint16_t*>(rank.shards()[i].param);
      out->params_seen.emplace_back(p, p + kNumel);
      ASSERT_TRUE(rank.Release({i}).ok());
    }
    ASSERT_TRUE(rank.IterationBoundary().ok());
    for (uint32_t i = kTensors; i-- > 0;) {
      ShardView& shard = rank.shards()[i];
      Fill16(shard, shard.grad, [step](uint64_t t, uint64_t e) { return Grad(t, e, step); });
      if (step == kOverflowStep && i == 0) reinterpret_cast<uint16_t*>(shard.grad)[7] = 0x7c00;  // +inf
      ASSERT_TRUE(rank.GradReady(i, step).ok());
      ASSERT_TRUE(rank.Flush().ok());
      if (!early || i == 0) continue;
      ++early_so_far;
      absl::StatusOr<JobSummary> job;
      for (int k = 0; k < 2000; ++k) {
        job = Find(client, name);
        ASSERT_TRUE(job.ok()) << job.status();
        if (job->shards_stepped_early >= early_so_far) break;
        absl::SleepFor(absl::Milliseconds(5));
      }
      ASSERT_EQ(job->shards_stepped_early, early_so_far) << "step " << step << " shard " << i << " was not stepped early";
    }
    auto result = rank.WaitStep(step);
    ASSERT_TRUE(result.ok()) << result.status();
    out->skipped.push_back(result->skipped);
  }
  // The params after the last step.
  for (uint32_t i = 0; i < kTensors; ++i) {
    ASSERT_TRUE(rank.Acquire({i}).ok());
    const uint16_t* p = reinterpret_cast<const uint16_t*>(rank.shards()[i].param);
    out->params_seen.emplace_back(p, p + kNumel);
    ASSERT_TRUE(rank.Release({i}).ok());
  }
  auto job = Find(client, name);
  ASSERT_TRUE(job.ok()) << job.status();
  out->stepped_early = job->shards_stepped_early;
  auto last = client.LastStep(name);
  ASSERT_TRUE(last.ok()) << last.status();
  out->last_step_early = last->shards_early;
}

TEST(DaemonEarlyStepTest, ShardsSteppedEarlyTrainTheSameBitsAndAnOverflowRollsThemBack) {
  DaemonProcess daemon(MakeTestDir("early_step", "rollback"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateJob(Spec("early", "0")).ok());
  ASSERT_TRUE(client->CreateJob(Spec("waits", "1e30")).ok());
  TrainRun early, waits;
  Train(*client, "early", /*early=*/true, &early);
  if (HasFatalFailure()) return;
  Train(*client, "waits", /*early=*/false, &waits);
  if (HasFatalFailure()) return;
  // Every gradient but each step's last was stepped early; the overflowed
  // step's three were rolled back.
  EXPECT_EQ(early.stepped_early, (kTensors - 1) * kSteps);
  EXPECT_EQ(early.last_step_early, kTensors - 1);
  EXPECT_EQ(waits.stepped_early, 0u);
  const std::vector<bool> expected_skips = {false, true, false, false};
  EXPECT_EQ(early.skipped, expected_skips);
  EXPECT_EQ(waits.skipped, expected_skips);
  ASSERT_EQ(early.params_seen.size(), waits.params_seen.size());
  for (size_t i = 0; i < early.params_seen.size(); ++i) {
    ASSERT_EQ(early.params_seen[i], waits.params_seen[i]) << "step " << i / kTensors << " shard " << i % kTensors;
  }
  // The params do move, and the skipped step moved none.
  EXPECT_NE(early.params_seen[0], early.params_seen[kTensors]);
  for (uint32_t i = 0; i < kTensors; ++i) {
    EXPECT_EQ(early.params_seen[kTensors + i], early.params_seen[2 * kTensors + i]) << "shard " << i;
  }
  EXPECT_EQ(daemon.Stop(), 0);
}

// The slot of a shard stepped early holds its new params until the step
// starts. A trainer that writes it again after GradReady (re-sending a
// gradient, which the barrier then ignores) must not have that gradient
// stored home as params: the step fails, naming the shard, and nothing of it
// is committed.
TEST(DaemonEarlyStepTest, AGradientSlotWrittenAfterItsShardWasSteppedFailsTheStep) {
  DaemonProcess daemon(MakeTestDir("early_step", "rewrite"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateJob(Spec("rewrite", "0")).ok());
  auto session = client->Attach("rewrite", 0);
  ASSERT_TRUE(session.ok()) << session.status();
  RankSession& rank = **session;
  std::vector<TensorDesc> model;
  for (uint32_t t = 0; t < kTensors; ++t) model.push_back({absl::StrCat("layer", t), kNumel});
  ASSERT_TRUE(rank.RegisterTensors(model).ok());
  for (ShardView& shard : rank.shards()) Fill16(shard, shard.param, Initial);
  ASSERT_TRUE(rank.InitParams().ok());
  auto grad = [](uint64_t t, uint64_t e) { return Grad(t, e, 0); };
  ShardView& last = rank.shards()[kTensors - 1];
  Fill16(last, last.grad, grad);
  ASSERT_TRUE(rank.GradReady(kTensors - 1, 0).ok());
  ASSERT_TRUE(rank.Flush().ok());
  absl::StatusOr<JobSummary> job;
  for (int k = 0; k < 2000; ++k) {
    job = Find(*client, "rewrite");
    ASSERT_TRUE(job.ok()) << job.status();
    if (job->shards_stepped_early >= 1) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(job->shards_stepped_early, 1u);
  // Sent again: taken as a duplicate, but the slot now holds a gradient.
  Fill16(last, last.grad, grad);
  ASSERT_TRUE(rank.GradReady(kTensors - 1, 0).ok());
  for (uint32_t i = kTensors - 1; i-- > 0;) {
    Fill16(rank.shards()[i], rank.shards()[i].grad, grad);
    ASSERT_TRUE(rank.GradReady(i, 0).ok());
  }
  auto result = rank.WaitStep(0);
  ASSERT_FALSE(result.ok());
  const std::string message(result.status().message());
  EXPECT_NE(message.find(absl::StrCat("gradient slot of shard ", kTensors - 1, " after its GradReady")),
            std::string::npos) << message;
  EXPECT_NE(message.find("nothing of step 0 was committed"), std::string::npos) << message;
  EXPECT_EQ(daemon.Stop(), 0);
}

}  // namespace
}  // namespace strata
