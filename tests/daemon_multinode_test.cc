// One job across several daemons (one per node): each serves its local ranks
// and the trainers agree on every step (PrepareStep, all-reduce, CommitStep).
// Two daemons x two ranks must give, bit for bit, what one daemon x four
// ranks gives -- with fp16 loss scaling, an overflow skip, clipping and two
// param groups on a schedule.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "tests/daemon_fixture.h"

namespace strata {
namespace {

std::string TestDir(const std::string& name) { return MakeTestDir("multinode", name); }

std::vector<TensorDesc> Model() {
  return {{"w1", 5000, 0}, {"b1", 37, 1}, {"w2", 12000, 0}, {"ln", 300, 1}, {"w3", 3000, 0}};
}

constexpr uint32_t kWorld = 4;

// fp16 bits of a value exact in fp16 (a multiple of 1/1024 below 2^15).
uint16_t Half(float v) {
  v = std::round(v * 1024.0f) / 1024.0f;
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint32_t sign = (bits >> 16) & 0x8000;
  const int exp = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
  if (v == 0) return 0;
  if (exp > 0) return static_cast<uint16_t>(sign | (exp << 10) | ((bits >> 13) & 0x3ff));
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::ldexp(std::fabs(v), 24)));
}

template <typename Fn>
void Fill16(const ShardView& shard, std::byte* base, Fn value) {
  uint16_t* out = reinterpret_cast<uint16_t*>(base);
  for (const OwnedRange& r : shard.ranges) {
    for (uint64_t e = 0; e < r.numel; ++e) out[r.shard_offset + e] = Half(value(r.tensor.value(), r.tensor_offset + e));
  }
}

float InitialParam(uint32_t t, uint64_t e) { return std::sin(0.001f * (e + 1) + t); }
// Scaled by the loss scale the trainer uses; rank-dependent, as data-parallel
// gradients are before the reduce (each rank holds its reduced partition).
float Grad(uint32_t t, uint64_t e, uint64_t step, double scale) {
  return static_cast<float>(std::cos(0.01f * e + t + 0.5f * step) * 0.25f * scale);
}

std::vector<GroupHyperparams> Schedule(int step) {
  const double warm = step < 2 ? (step + 1) / 2.0 : 1.0;
  return {GroupHyperparams{0.01 * warm, 0.9, 0.999, 1e-8, 0.1, 0},
          GroupHyperparams{0.02 * warm, 0.9, 0.99, 1e-8, 0.0, 0}};
}

template <typename Fn>
void Fill32(const ShardView& shard, std::byte* base, Fn value) {
  float* out = reinterpret_cast<float*>(base);
  for (const OwnedRange& r : shard.ranges) {
    for (uint64_t e = 0; e < r.numel; ++e) out[r.shard_offset + e] = value(r.tensor.value(), r.tensor_offset + e);
  }
}

JobSpec Spec(const std::string& name, DType grad_dtype = DType::kFp16) {
  JobSpec spec;
  spec.name = name;
  spec.world_size = kWorld;
  spec.mode = JobMode::kOffload;
  spec.deepspeed_config_json = R"({"zero_optimization": {"stage": 2, "sub_group_size": 4096},
      "fp16": {"enabled": true, "initial_scale_power": 6, "hysteresis": 1},
      "gradient_clipping": 0.5,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})";
  spec.param_dtype = DType::kFp16;
  spec.grad_dtype = grad_dtype;
  return spec;
}

// What the trainers see after every step: the step results and every rank's
// param slots.
struct Trace {
  std::vector<StepResult> results;  // rank 0's, per step
  std::vector<std::vector<uint16_t>> params;  // per rank, all its shards' slots
};

constexpr int kSteps = 4;

// Runs kSteps steps over ranks spread across `clients` (rank r talks to
// clients[r / ranks_per_daemon]); with more than one client the steps are
// agreed externally. Step 1 has an inf in rank 3's gradient.
void RunJob(std::vector<StrataClient*> clients, const std::string& name, DType grad_dtype, Trace* trace) {
  const uint32_t per_daemon = kWorld / static_cast<uint32_t>(clients.size());
  const bool external = clients.size() > 1;
  for (size_t d = 0; d < clients.size(); ++d) {
    JobSpec spec = Spec(name, grad_dtype);
    if (external) {
      for (uint32_t r = 0; r < per_daemon; ++r) spec.local_ranks.push_back(static_cast<uint32_t>(d) * per_daemon + r);
      spec.external_step_agreement = true;
    }
    auto created = clients[d]->CreateJob(spec);
    ASSERT_TRUE(created.ok()) << created.status();
  }
  std::vector<std::unique_ptr<RankSession>> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) {
    auto s = clients[r / per_daemon]->Attach(name, r);
    ASSERT_TRUE(s.ok()) << s.status();
    ranks.push_back(std::move(*s));
    ASSERT_TRUE(ranks[r]->RegisterTensors(Model()).ok());
    for (ShardView& shard : ranks[r]->shards()) Fill16(shard, shard.param, InitialParam);
  }
  {
    std::vector<std::thread> init;
    std::vector<absl::Status> status(kWorld);
    for (uint32_t r = 0; r < kWorld; ++r) init.emplace_back([&, r] { status[r] = ranks[r]->InitParams(); });
    for (auto& t : init) t.join();
    for (const auto& s : status) ASSERT_TRUE(s.ok()) << s;
  }
  double scale = 64;
  for (int step = 0; step < kSteps; ++step) {
    for (uint32_t r = 0; r < kWorld; ++r) {
      ASSERT_TRUE(ranks[r]->BeginStep(step, Schedule(step)).ok());
      for (ShardView& shard : ranks[r]->shards()) {
        auto grad = [&](uint32_t t, uint64_t e) { return Grad(t, e + 7919 * r, step, scale) * (1 + 0.37f * r); };
        if (grad_dtype == DType::kFp16) Fill16(shard, shard.grad, grad);
        else Fill32(shard, shard.grad, grad);
        if (step == 1 && r == 3 && shard.index == 0) {
          // An owned element: a shard may be all padding, never rewritten.
          const uint64_t at = shard.ranges.at(0).shard_offset;
          if (grad_dtype == DType::kFp16) reinterpret_cast<uint16_t*>(shard.grad)[at] = 0x7c00;  // +inf
          else reinterpret_cast<float*>(shard.grad)[at] = INFINITY;
        }
        ASSERT_TRUE(ranks[r]->GradReady(shard.index, step).ok());
      }
    }
    if (external) {
      // What torch.distributed does: every rank learns its daemon's share,
      // all-reduces (OR, SUM in node order) and commits.
      std::vector<LocalStepStats> local(kWorld);
      for (uint32_t r = 0; r < kWorld; ++r) {
        auto got = ranks[r]->PrepareStep(step);
        ASSERT_TRUE(got.ok()) << got.status();
        local[r] = *got;
      }
      bool overflow = false;
      double squared = 0;
      for (uint32_t d = 0; d < clients.size(); ++d) {
        // Ranks of one daemon see the same share.
        for (uint32_t r = d * per_daemon + 1; r < (d + 1) * per_daemon; ++r) {
          EXPECT_EQ(local[r].overflow, local[d * per_daemon].overflow);
          EXPECT_EQ(local[r].squared_norm, local[d * per_daemon].squared_norm);
        }
        overflow = overflow || local[d * per_daemon].overflow;
        squared += local[d * per_daemon].squared_norm;
      }
      EXPECT_EQ(overflow, step == 1);
      for (uint32_t r = 0; r < kWorld; ++r) ASSERT_TRUE(ranks[r]->CommitStep(step, overflow, squared).ok());
    }
    for (uint32_t r = 0; r < kWorld; ++r) {
      auto result = ranks[r]->WaitStep(step);
      ASSERT_TRUE(result.ok()) << result.status();
      if (r == 0) trace->results.push_back(*result);
      EXPECT_EQ(result->skipped, step == 1);
    }
    scale = trace->results.back().loss_scale;
  }
  for (uint32_t r = 0; r < kWorld; ++r) {
    std::vector<uint16_t> all;
    for (const ShardView& shard : ranks[r]->shards()) {
      const uint16_t* p = reinterpret_cast<const uint16_t*>(shard.param);
      all.insert(all.end(), p, p + shard.padded_numel);
    }
    trace->params.push_back(std::move(all));
  }
}

void ExpectOneDaemonEqualsTwo(DType grad_dtype) {
  CleanDaemon one(TestDir("one"));
  CleanDaemon node0(TestDir("node0"));
  CleanDaemon node1(TestDir("node1"));
  ASSERT_TRUE(one.Start());
  ASSERT_TRUE(node0.Start());
  ASSERT_TRUE(node1.Start());
  auto c_one = one.Connect();
  auto c0 = node0.Connect();
  auto c1 = node1.Connect();
  Trace single, split;
  RunJob({c_one.get()}, "job", grad_dtype, &single);
  RunJob({c0.get(), c1.get()}, "job", grad_dtype, &split);
  ASSERT_EQ(single.results.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(split.results.size(), static_cast<size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    const StepResult& a = single.results[step];
    const StepResult& b = split.results[step];
    EXPECT_EQ(a.skipped, b.skipped) << "step " << step;
    EXPECT_EQ(a.loss_scale, b.loss_scale) << "step " << step;
    EXPECT_EQ(a.optimizer_steps, b.optimizer_steps) << "step " << step;
    if (!a.skipped) {
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
      EXPECT_GT(a.grad_norm, 0.5) << "the test wants clipping at step " << step;
    }
  }
  EXPECT_EQ(single.results[1].loss_scale, 32.0);  // the overflow halved 64
  EXPECT_EQ(single.results.back().optimizer_steps, static_cast<uint64_t>(kSteps - 1));
  ASSERT_EQ(single.params.size(), split.params.size());
  for (uint32_t r = 0; r < kWorld; ++r) {
    ASSERT_EQ(single.params[r].size(), split.params[r].size());
    EXPECT_TRUE(single.params[r] == split.params[r]) << "rank " << r << "'s params differ";
  }
  EXPECT_EQ(one.Stop(), 0);
  EXPECT_EQ(node0.Stop(), 0);
  EXPECT_EQ(node1.Stop(), 0);
}

TEST(DaemonMultinodeTest, TwoDaemonsOfTwoRanksEqualOneDaemonOfFourBitForBit) {
  ExpectOneDaemonEqualsTwo(DType::kFp16);
}

// fp32 gradients: their squares do not sum exactly in double (fp16 ones
// mostly do), so this is where the order of the norm's sum shows.
TEST(DaemonMultinodeTest, TwoDaemonsEqualOneBitForBitWithFp32Gradients) {
  ExpectOneDaemonEqualsTwo(DType::kFp32);
}

TEST(DaemonMultinodeTest, AgreementErrorsNameTheProblem) {
  CleanDaemon daemon(TestDir("errors"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  JobSpec spec = Spec("node");
  spec.local_ranks = {2, 3};
  spec.external_step_agreement = true;
  // A local rank outside the world.
  JobSpec bad = spec;
  bad.name = "bad";
  bad.local_ranks = {2, 4};
  absl::StatusOr<uint64_t> created = client->CreateJob(bad);
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument) << created.status();
  EXPECT_NE(created.status().message().find("local_ranks"), std::string::npos) << created.status();
  ASSERT_TRUE(client->CreateJob(spec).ok());
  // Rank 0 belongs to another daemon.
  auto foreign = client->Attach("node", 0);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kInvalidArgument) << foreign.status();
  std::vector<std::unique_ptr<RankSession>> ranks;
  for (uint32_t r : {2u, 3u}) {
    auto s = client->Attach("node", r);
    ASSERT_TRUE(s.ok()) << s.status();
    ranks.push_back(std::move(*s));
    ASSERT_TRUE(ranks.back()->RegisterTensors(Model()).ok());
    for (ShardView& shard : ranks.back()->shards()) Fill16(shard, shard.param, InitialParam);
  }
  std::thread other([&] { ASSERT_TRUE(ranks[1]->InitParams().ok()); });
  ASSERT_TRUE(ranks[0]->InitParams().ok());
  other.join();
  // Only rank 2's gradients are in: committing is premature.
  for (ShardView& shard : ranks[0]->shards()) {
    Fill16(shard, shard.grad, [](uint32_t t, uint64_t e) { return Grad(t, e, 0, 64); });
    if (shard.index == 0) reinterpret_cast<uint16_t*>(shard.grad)[shard.ranges.at(0).shard_offset] = 0x7c00;
    ASSERT_TRUE(ranks[0]->GradReady(shard.index, 0).ok());
  }
  absl::Status s = ranks[0]->CommitStep(0, true, 1.0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  for (ShardView& shard : ranks[1]->shards()) {
    Fill16(shard, shard.grad, [](uint32_t t, uint64_t e) { return Grad(t, e, 0, 64); });
    ASSERT_TRUE(ranks[1]->GradReady(shard.index, 0).ok());
  }
  auto local = ranks[1]->PrepareStep(0);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_TRUE(local->overflow);
  // A global flag that hides this daemon's overflow is refused.
  s = ranks[0]->CommitStep(0, false, local->squared_norm);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("overflow"), std::string::npos) << s;
  // (The norm of an overflowed step is inf; any value goes with overflow.)
  ASSERT_TRUE(ranks[0]->CommitStep(0, true, 5.0).ok());
  // The same commit again is fine; a different one is not.
  EXPECT_TRUE(ranks[1]->CommitStep(0, true, 5.0).ok());
  s = ranks[1]->CommitStep(0, true, 6.0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  auto result = ranks[1]->WaitStep(0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->skipped);
  // Step 1 without overflow: a global norm below this daemon's share is refused.
  for (auto& rank : ranks) {
    for (ShardView& shard : rank->shards()) {
      Fill16(shard, shard.grad, [](uint32_t t, uint64_t e) { return Grad(t, e, 1, 32); });
      ASSERT_TRUE(rank->GradReady(shard.index, 1).ok());
    }
  }
  local = ranks[0]->PrepareStep(1);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_FALSE(local->overflow);
  s = ranks[0]->CommitStep(1, false, local->squared_norm / 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  ASSERT_TRUE(ranks[0]->CommitStep(1, false, local->squared_norm).ok());
  result = ranks[0]->WaitStep(1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->skipped);
  // A job without external agreement has no PrepareStep.
  JobSpec plain = Spec("plain");
  plain.world_size = 1;
  ASSERT_TRUE(client->CreateJob(plain).ok());
  auto lone = client->Attach("plain", 0);
  ASSERT_TRUE(lone.ok());
  ASSERT_TRUE((*lone)->RegisterTensors(Model()).ok());
  EXPECT_EQ((*lone)->PrepareStep(0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(daemon.running());
  EXPECT_EQ(daemon.Stop(), 0);
}

}  // namespace
}  // namespace strata
