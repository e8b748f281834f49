// Param groups and per-step hyperparameters (BeginStep) end to end: a real
// stratad, real clients; every owned param must equal, bit for bit, what the
// CPU optimizer computes per tensor with its group's hyperparameters.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "optimizer_cpu/cpu_optimizer.h"
#include "tests/daemon_fixture.h"
#include "tests/infinity_job.h"

namespace strata {
namespace {

std::string TestDir(const std::string& name) { return MakeTestDir("groups", name); }

// Decay on the weights (group 0), none on biases and norms (group 1), in an
// interleaved order so flat shards hold runs of both groups.
std::vector<TensorDesc> Model() {
  return {{"w1", 5000, 0}, {"b1", 37, 1}, {"w2", 12000, 0}, {"ln", 300, 1}, {"w3", 3000, 0}};
}

float InitialParam(uint32_t t, uint64_t e) { return std::sin(0.001f * (e + 1) + t); }
float Grad(uint32_t t, uint64_t e, uint64_t step) { return std::cos(0.01f * e + t + 0.5f * step) * 0.1f; }

template <typename Fn>
void Fill(const ShardView& shard, std::byte* base, Fn value) {
  float* out = reinterpret_cast<float*>(base);
  for (const OwnedRange& r : shard.ranges) {
    for (uint64_t e = 0; e < r.numel; ++e) out[r.shard_offset + e] = value(r.tensor.value(), r.tensor_offset + e);
  }
}

// A warmup-then-decay schedule per group; a step for which it returns no
// groups sends no BeginStep (the last values stay in force).
using Schedule = std::function<std::vector<GroupHyperparams>(int step)>;

std::vector<GroupHyperparams> TwoGroups(int step) {
  const double scale = step < 2 ? (step + 1) / 2.0 : 1.0 / (step - 1);
  GroupHyperparams decay{0.01 * scale, 0.9, 0.999, 1e-8, 0.1, 0};
  GroupHyperparams no_decay{0.02 * scale, 0.8, 0.99, 1e-6, 0.0, 0};
  return {decay, no_decay};
}

// Sends BeginStep only on even steps.
std::vector<GroupHyperparams> EvenStepsOnly(int step) {
  if (step % 2 == 1) return {};
  return TwoGroups(step);
}

// The job's own optimizer (before any BeginStep).
constexpr double kJobLr = 0.005;
constexpr double kJobWd = 0.05;

JobSpec OffloadSpec(const std::string& name) {
  JobSpec spec;
  spec.name = name;
  spec.world_size = 2;
  spec.mode = JobMode::kOffload;
  // Sub-groups of 4096 elements: flat shards are cut into several, and many
  // hold runs of both groups.
  spec.deepspeed_config_json = R"({"gradient_clipping": 0, "zero_optimization": {"stage": 2, "sub_group_size": 4096},
      "optimizer": {"type": "AdamW", "params": {"lr": 0.005, "weight_decay": 0.05}}})";
  spec.param_dtype = DType::kFp32;
  spec.grad_dtype = DType::kFp32;
  return spec;
}

// Per tensor, AdamW with the hyperparameters in force at each step.
std::vector<std::vector<float>> Reference(int steps, const Schedule& schedule) {
  auto opt = CpuOptimizer::Create({});
  std::vector<TensorDesc> model = Model();
  OptimizerHyperparams job;
  job.kind = OptimizerKind::kAdamW;
  job.lr = kJobLr;
  job.weight_decay = kJobWd;
  std::vector<OptimizerHyperparams> in_force(2, job);
  std::vector<std::vector<float>> p(model.size()), m(model.size()), v(model.size());
  for (uint32_t t = 0; t < model.size(); ++t) {
    p[t].resize(model[t].numel);
    m[t].assign(model[t].numel, 0);
    v[t].assign(model[t].numel, 0);
    for (uint64_t e = 0; e < model[t].numel; ++e) p[t][e] = InitialParam(t, e);
  }
  for (int step = 0; step < steps; ++step) {
    const std::vector<GroupHyperparams> groups = schedule(step);
    for (size_t g = 0; g < groups.size(); ++g) {
      in_force[g].lr = groups[g].lr;
      in_force[g].beta1 = groups[g].beta1;
      in_force[g].beta2 = groups[g].beta2;
      in_force[g].eps = groups[g].eps;
      in_force[g].weight_decay = groups[g].weight_decay;
    }
    for (uint32_t t = 0; t < model.size(); ++t) {
      std::vector<float> g(model[t].numel);
      for (uint64_t e = 0; e < g.size(); ++e) g[e] = Grad(t, e, step);
      StepSpans spans;
      spans.size = g.size();
      spans.params = p[t].data();
      spans.exp_avg = m[t].data();
      spans.exp_avg_sq = v[t].data();
      spans.grad = g.data();
      EXPECT_TRUE((*opt)->Step(in_force[model[t].group], step + 1, spans).ok());
    }
  }
  return p;
}

struct Job2 {
  std::vector<std::unique_ptr<RankSession>> ranks;
  bool infinity = false;
};

// Attaches and registers both ranks; initializes params when `init`.
void Attach(StrataClient& client, const std::string& name, bool infinity, bool init, Job2* job) {
  for (uint32_t r = 0; r < 2; ++r) {
    auto s = client.Attach(name, r);
    ASSERT_TRUE(s.ok()) << s.status();
    job->ranks.push_back(std::move(*s));
    ASSERT_TRUE(job->ranks[r]->RegisterTensors(Model()).ok());
    if (init) {
      for (ShardView& shard : job->ranks[r]->shards()) Fill(shard, shard.param, InitialParam);
    }
  }
  job->infinity = infinity;
  if (!init) return;
  absl::Status status[2];
  std::thread other([&] { status[1] = job->ranks[1]->InitParams(); });
  status[0] = job->ranks[0]->InitParams();
  other.join();
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
}

void RunSteps(Job2& job, int first, int count, const Schedule& schedule) {
  for (int step = first; step < first + count; ++step) {
    const std::vector<GroupHyperparams> groups = schedule(step);
    for (uint32_t r = 0; r < 2; ++r) {
      RankSession& rank = *job.ranks[r];
      // Every rank sends the same values; the first wins, the others agree.
      if (!groups.empty()) {
        ASSERT_TRUE(rank.BeginStep(step, groups).ok()) << "step " << step;
      }
      if (job.infinity) {
        for (const ShardView& shard : rank.shards()) {
          ASSERT_TRUE(rank.Acquire({shard.index}).ok());
          ASSERT_TRUE(rank.Release({shard.index}).ok());
        }
        ASSERT_TRUE(rank.IterationBoundary().ok());
      }
      for (ShardView& shard : rank.shards()) {
        Fill(shard, shard.grad, [&](uint32_t t, uint64_t e) { return Grad(t, e, step); });
        ASSERT_TRUE(rank.GradReady(shard.index, step).ok());
      }
    }
    for (uint32_t r = 0; r < 2; ++r) {
      auto result = job.ranks[r]->WaitStep(step);
      ASSERT_TRUE(result.ok()) << result.status();
    }
  }
}

void ExpectParams(Job2& job, const std::vector<std::vector<float>>& expected) {
  std::vector<TensorDesc> model = Model();
  std::vector<uint64_t> checked(model.size(), 0);
  for (uint32_t r = 0; r < 2; ++r) {
    RankSession& rank = *job.ranks[r];
    for (const ShardView& shard : rank.shards()) {
      if (job.infinity) {
        ASSERT_TRUE(rank.Acquire({shard.index}).ok());
      }
      const float* got = reinterpret_cast<const float*>(shard.param);
      for (const OwnedRange& range : shard.ranges) {
        for (uint64_t e = 0; e < range.numel; ++e) {
          ASSERT_EQ(got[range.shard_offset + e], expected[range.tensor.value()][range.tensor_offset + e])
              << "rank " << r << " tensor " << model[range.tensor.value()].name << " element "
              << range.tensor_offset + e;
        }
        checked[range.tensor.value()] += range.numel;
      }
      if (job.infinity) {
        ASSERT_TRUE(rank.Release({shard.index}).ok());
      }
    }
  }
  for (uint32_t t = 0; t < model.size(); ++t) EXPECT_EQ(checked[t], model[t].numel) << model[t].name;
}

TEST(DaemonGroupsTest, TwoGroupsWithAScheduleMatchTheLocalOptimizerPerTensor) {
  CleanDaemon daemon(TestDir("offload"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_TRUE(client->CreateJob(OffloadSpec("groups")).ok());
  Job2 job;
  Attach(*client, "groups", false, true, &job);
  ASSERT_GT(job.ranks[0]->shards().size(), 1u) << "the test wants several sub-groups";
  RunSteps(job, 0, 5, TwoGroups);
  ExpectParams(job, Reference(5, TwoGroups));
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonGroupsTest, StepsWithoutBeginStepKeepTheLastValuesAndTheJobsBeforeAny) {
  CleanDaemon daemon(TestDir("sticky"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_TRUE(client->CreateJob(OffloadSpec("sticky")).ok());
  Job2 job;
  Attach(*client, "sticky", false, true, &job);
  auto late_start = [](int step) { return step == 0 ? std::vector<GroupHyperparams>{} : EvenStepsOnly(step); };
  RunSteps(job, 0, 5, late_start);
  ExpectParams(job, Reference(5, late_start));
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonGroupsTest, InfinityGroupsSurviveADaemonRestart) {
  const std::string dir = TestDir("infinity");
  {
    DaemonProcess daemon(dir);  // its NVMe files are what the restart finds
    ASSERT_TRUE(daemon.Start());
    auto client = daemon.Connect();
    ASSERT_TRUE(client->CreateJob(SmallInfinitySpec("inf", kJobLr, kJobWd)).ok());
    Job2 job;
    Attach(*client, "inf", true, true, &job);
    RunSteps(job, 0, 3, TwoGroups);
    ExpectParams(job, Reference(3, TwoGroups));
    job.ranks.clear();
    client.reset();
    EXPECT_EQ(daemon.Stop(), 0);
  }
  CleanDaemon daemon(dir);
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  Job2 job;
  Attach(*client, "inf", true, false, &job);
  // Step 3 sends no BeginStep: step 2's values (persisted) stay in force.
  auto schedule = [](int step) { return step == 3 ? std::vector<GroupHyperparams>{} : TwoGroups(step); };
  RunSteps(job, 3, 2, schedule);
  ExpectParams(job, Reference(5, schedule));
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonGroupsTest, ACheckpointKeepsGroupsAndHyperparameters) {
  const std::string dir = TestDir("ckpt");
  CleanDaemon daemon(dir);
  ASSERT_TRUE(daemon.Start({"--checkpoint_root", dir}));  // checkpoints live beneath it
  auto client = daemon.Connect();
  ASSERT_TRUE(client->CreateJob(OffloadSpec("saved")).ok());
  {
    Job2 job;
    Attach(*client, "saved", false, true, &job);
    RunSteps(job, 0, 3, TwoGroups);
  }
  ASSERT_TRUE(client->SaveCheckpoint("saved", dir + "/ckpt").ok());
  ASSERT_TRUE(client->DeleteJob("saved").ok());
  auto loaded = client->LoadCheckpoint(dir + "/ckpt", "restored");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  Job2 job;
  Attach(*client, "restored", false, false, &job);
  auto schedule = [](int step) { return step == 3 ? std::vector<GroupHyperparams>{} : TwoGroups(step); };
  RunSteps(job, 3, 2, schedule);
  ExpectParams(job, Reference(5, schedule));
  // A rank registering other groups than the checkpoint's is refused.
  auto other = client->Attach("restored", 0);
  ASSERT_TRUE(other.ok());
  std::vector<TensorDesc> regrouped = Model();
  regrouped[1].group = 0;
  absl::Status s = (*other)->RegisterTensors(regrouped);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("group"), std::string::npos) << s;
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonGroupsTest, BeginStepErrorsNameTheProblem) {
  CleanDaemon daemon(TestDir("errors"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_TRUE(client->CreateJob(OffloadSpec("bad")).ok());
  Job2 job;
  Attach(*client, "bad", false, true, &job);
  RankSession& r0 = *job.ranks[0];
  RankSession& r1 = *job.ranks[1];
  std::vector<GroupHyperparams> groups = TwoGroups(0);

  // Too few groups for the registered group indices (0 and 1).
  absl::Status s = r0.BeginStep(0, absl::MakeSpan(groups).subspan(0, 1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("2 groups needed"), std::string::npos) << s;
  // A value out of range names the group and field.
  std::vector<GroupHyperparams> negative = groups;
  negative[1].lr = -1;
  s = r0.BeginStep(0, negative);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("group 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("lr"), std::string::npos) << s;
  // Not the open step.
  s = r0.BeginStep(1, groups);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  // The first BeginStep wins; a different one from another rank is refused.
  ASSERT_TRUE(r0.BeginStep(0, groups).ok());
  std::vector<GroupHyperparams> different = groups;
  different[1].weight_decay = 0.01;
  s = r1.BeginStep(0, different);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("group 1 weight_decay"), std::string::npos) << s;
  ASSERT_TRUE(r1.BeginStep(0, groups).ok());
  // Step 1: a BeginStep after the step's first GradReady is too late.
  RunSteps(job, 0, 1, [](int) { return std::vector<GroupHyperparams>{}; });
  Fill(r0.shards()[0], r0.shards()[0].grad, [](uint32_t t, uint64_t e) { return Grad(t, e, 1); });
  ASSERT_TRUE(r0.GradReady(0, 1).ok());
  // Through the doorbell GradReady returns once the signal is in the ring;
  // Flush waits until the daemon took it, so the BeginStep below (gRPC,
  // another rank) comes after it on a slow or loaded machine too.
  ASSERT_TRUE(r0.Flush().ok());
  s = r1.BeginStep(1, TwoGroups(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("after the step's first GradReady"), std::string::npos) << s;
  // Step 0 is done: the same BeginStep again is a duplicate (ranks that
  // re-attach after a crash repeat the step they were in); other values for
  // it are refused.
  EXPECT_TRUE(r1.BeginStep(0, groups).ok());
  s = r1.BeginStep(0, different);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // Group indices far out of range are refused at registration.
  ASSERT_TRUE(client->CreateJob(OffloadSpec("huge-group")).ok());
  auto attached = client->Attach("huge-group", 0);
  ASSERT_TRUE(attached.ok());
  std::vector<TensorDesc> model = Model();
  model[0].group = 1u << 20;
  s = (*attached)->RegisterTensors(model);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(daemon.running());
  EXPECT_EQ(daemon.Stop(), 0);
}

}  // namespace
}  // namespace strata
