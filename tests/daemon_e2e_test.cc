// stratad end to end: real daemon process, real client, shared memory.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/doorbell_layout.h"
#include "core/unix_socket.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "tests/daemon_fixture.h"
#include "tests/infinity_job.h"

namespace strata {
namespace {

std::string TestDir(const std::string& name) { return MakeTestDir("e2e", name); }

constexpr char kAdamW[] =
    R"({"gradient_clipping": 0, "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}}})";

std::vector<TensorDesc> Model() { return {{"w1", 5000}, {"b1", 37}, {"w2", 12000}}; }

// Writes value(tensor, element) into every owned element of a shard slot.
template <typename Fn>
void Fill(const ShardView& shard, std::byte* base, Fn value) {
  float* out = reinterpret_cast<float*>(base);
  for (const OwnedRange& r : shard.ranges) {
    for (uint64_t e = 0; e < r.numel; ++e) out[r.shard_offset + e] = value(r.tensor.value(), r.tensor_offset + e);
  }
}

float InitialParam(uint32_t t, uint64_t e) { return std::sin(0.001f * (e + 1) + t); }
float Grad(uint32_t t, uint64_t e, uint64_t step) { return std::cos(0.01f * e + t + 0.5f * step) * 0.1f; }

// Reference: whole tensors stepped locally with the same CPU optimizer.
std::vector<std::vector<float>> LocalReference(int steps) {
  auto opt = CpuOptimizer::Create({});
  OptimizerHyperparams hp;
  hp.kind = OptimizerKind::kAdamW;
  hp.lr = 0.01;
  hp.weight_decay = 0.1;
  std::vector<std::vector<float>> params;
  std::vector<TensorDesc> model = Model();
  for (uint32_t t = 0; t < model.size(); ++t) {
    const uint64_t n = model[t].numel;
    std::vector<float> p(n), m(n, 0), v(n, 0), g(n);
    for (uint64_t e = 0; e < n; ++e) p[e] = InitialParam(t, e);
    for (int step = 0; step < steps; ++step) {
      for (uint64_t e = 0; e < n; ++e) g[e] = Grad(t, e, step);
      StepSpans spans;
      spans.size = n;
      spans.params = p.data();
      spans.exp_avg = m.data();
      spans.exp_avg_sq = v.data();
      spans.grad = g.data();
      EXPECT_TRUE((*opt)->Step(hp, step + 1, spans).ok());
    }
    params.push_back(std::move(p));
  }
  return params;
}

struct Rank {
  std::unique_ptr<RankSession> session;
};

// Two ranks of an fp32 AdamW job take `steps` steps; every owned param must
// equal what the CPU optimizer computes locally on the same data.
// `doorbell`: whether the ranks' GradReady/WaitStep must go through the
// shared-memory doorbell (true) or gRPC (false); unset: either.
void RunOffloadJob(StrataClient& client, const std::string& name, int steps,
                   std::optional<bool> doorbell = std::nullopt) {
  JobSpec spec;
  spec.name = name;
  spec.world_size = 2;
  spec.mode = JobMode::kOffload;
  spec.deepspeed_config_json = kAdamW;
  spec.param_dtype = DType::kFp32;
  spec.grad_dtype = DType::kFp32;
  ASSERT_TRUE(client.CreateJob(spec).ok());
  std::vector<Rank> ranks(2);
  for (uint32_t r = 0; r < 2; ++r) {
    auto s = client.Attach(name, r);
    ASSERT_TRUE(s.ok()) << s.status();
    ranks[r].session = std::move(*s);
    ASSERT_TRUE(ranks[r].session->RegisterTensors(Model()).ok());
    if (doorbell.has_value()) {
      ASSERT_EQ(ranks[r].session->doorbell_active(), *doorbell);
    }
    for (ShardView& shard : ranks[r].session->shards()) Fill(shard, shard.param, InitialParam);
    ASSERT_TRUE(ranks[r].session->InitParams().ok());
  }
  for (int step = 0; step < steps; ++step) {
    for (uint32_t r = 0; r < 2; ++r) {
      for (ShardView& shard : ranks[r].session->shards()) {
        Fill(shard, shard.grad, [&](uint32_t t, uint64_t e) { return Grad(t, e, step); });
        ASSERT_TRUE(ranks[r].session->GradReady(shard.index, step).ok());
      }
    }
    for (uint32_t r = 0; r < 2; ++r) {
      auto result = ranks[r].session->WaitStep(step);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_FALSE(result->skipped);
      EXPECT_EQ(result->optimizer_steps, static_cast<uint64_t>(step + 1));
    }
    // A signal of the step just applied, sent again (ranks re-attached after a
    // crash repeat the step they were in), is a duplicate; older ones fail.
    EXPECT_TRUE(ranks[1].session->GradReady(0, step).ok());
    if (step > 0) {
      EXPECT_EQ(ranks[1].session->GradReady(0, step - 1).code(), absl::StatusCode::kFailedPrecondition);
    }
  }
  const std::vector<std::vector<float>> expected = LocalReference(steps);
  std::vector<TensorDesc> model = Model();
  for (uint32_t t = 0; t < model.size(); ++t) {
    const uint64_t n = model[t].numel;
    const std::vector<float>& p = expected[t];
    uint64_t checked = 0;
    for (uint32_t r = 0; r < 2; ++r) {
      for (const ShardView& shard : ranks[r].session->shards()) {
        const float* got = reinterpret_cast<const float*>(shard.param);
        for (const OwnedRange& range : shard.ranges) {
          if (range.tensor.value() != t) continue;
          for (uint64_t e = 0; e < range.numel; ++e) {
            ASSERT_EQ(got[range.shard_offset + e], p[range.tensor_offset + e])
                << name << " tensor " << t << " element " << range.tensor_offset + e;
            ++checked;
          }
        }
      }
    }
    EXPECT_EQ(checked, n);
  }
}

// ZeRO-Infinity: params and optimizer states on NVMe, a pinned budget smaller
// than the params; each step acquires every layer's shards (forward), then
// again in reverse (backward), as a trainer would.
void RunInfinityJob(StrataClient& client, const std::string& name, int steps, int first_step) {
  std::vector<std::unique_ptr<RankSession>> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    auto s = client.Attach(name, r);
    ASSERT_TRUE(s.ok()) << s.status();
    ranks.push_back(std::move(*s));
    ASSERT_TRUE(ranks[r]->RegisterTensors(Model()).ok());
    ASSERT_EQ(ranks[r]->shards().size(), Model().size());  // stage 3: one shard per tensor
    if (first_step == 0) {
      for (ShardView& shard : ranks[r]->shards()) Fill(shard, shard.param, InitialParam);
    }
  }
  if (first_step == 0) {
    // Both ranks initialize at once, as real trainers do.
    absl::Status init[2];
    std::thread other([&] { init[1] = ranks[1]->InitParams(); });
    init[0] = ranks[0]->InitParams();
    other.join();
    ASSERT_TRUE(init[0].ok()) << init[0];
    ASSERT_TRUE(init[1].ok()) << init[1];
  }
  for (int step = first_step; step < first_step + steps; ++step) {
    for (uint32_t r = 0; r < 2; ++r) {
      const uint32_t n = static_cast<uint32_t>(ranks[r]->shards().size());
      for (uint32_t i = 0; i < n; ++i) {
        ASSERT_TRUE(ranks[r]->Acquire({i}).ok());
        ASSERT_TRUE(ranks[r]->Release({i}).ok());
      }
      for (uint32_t i = n; i-- > 0;) {
        ASSERT_TRUE(ranks[r]->Acquire({i}).ok());
        ASSERT_TRUE(ranks[r]->Release({i}).ok());
      }
      ASSERT_TRUE(ranks[r]->IterationBoundary().ok());
      for (ShardView& shard : ranks[r]->shards()) {
        Fill(shard, shard.grad, [&](uint32_t t, uint64_t e) { return Grad(t, e, step); });
        ASSERT_TRUE(ranks[r]->GradReady(shard.index, step).ok());
      }
    }
    for (uint32_t r = 0; r < 2; ++r) {
      auto result = ranks[r]->WaitStep(step);
      ASSERT_TRUE(result.ok()) << result.status();
    }
  }
  std::vector<std::vector<float>> expected = LocalReference(first_step + steps);
  for (uint32_t r = 0; r < 2; ++r) {
    for (const ShardView& shard : ranks[r]->shards()) {
      ASSERT_TRUE(ranks[r]->Acquire({shard.index}).ok());
      const float* got = reinterpret_cast<const float*>(shard.param);
      for (const OwnedRange& range : shard.ranges) {
        for (uint64_t e = 0; e < range.numel; ++e) {
          ASSERT_EQ(got[range.shard_offset + e], expected[range.tensor.value()][range.tensor_offset + e])
              << "rank " << r << " tensor " << range.tensor.value() << " element " << range.tensor_offset + e;
        }
      }
      ASSERT_TRUE(ranks[r]->Release({shard.index}).ok());
    }
  }
}

TEST(DaemonE2ETest, InfinityStepsFromNvmeMatchTheLocalOptimizer) {
  DaemonProcess daemon(TestDir("infinity"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_TRUE(client->CreateJob(SmallInfinitySpec("inf")).ok());
  RunInfinityJob(*client, "inf", 3, 0);
  auto stats = client->StatsText();
  ASSERT_TRUE(stats.ok());
  EXPECT_NE(stats->find("inf"), std::string::npos);
  // Deleting a job while its prefetcher may still be reading leaves the
  // daemon serving (this once crashed it).
  for (int i = 0; i < 3; ++i) {
    const std::string name = absl::StrCat("gone", i);
    ASSERT_TRUE(client->CreateJob(SmallInfinitySpec(name)).ok());
    RunInfinityJob(*client, name, 1, 0);
    ASSERT_TRUE(client->DeleteJob(name).ok());
  }
  EXPECT_TRUE(client->Noop().ok());
  EXPECT_TRUE(daemon.running());
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonE2ETest, SigtermThenRestartFindsTheInfinityJobOnNvme) {
  const std::string dir = TestDir("restart");
  {
    DaemonProcess daemon(dir);
    ASSERT_TRUE(daemon.Start());
    auto client = daemon.Connect();
    ASSERT_TRUE(client->CreateJob(SmallInfinitySpec("durable")).ok());
    RunInfinityJob(*client, "durable", 2, 0);
    client.reset();
    EXPECT_EQ(daemon.Stop(), 0);
  }
  DaemonProcess daemon(dir);
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  auto jobs = client->ListJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].name, "durable");
  EXPECT_EQ((*jobs)[0].step, 2u);
  // Two more steps from the restored state equal four steps without a restart.
  RunInfinityJob(*client, "durable", 2, 2);
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonE2ETest, OffloadStepsMatchTheLocalOptimizerBitForBit) {
  DaemonProcess daemon(TestDir("offload"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  RunOffloadJob(*client, "offload-a", 3, /*doorbell=*/true);
  EXPECT_EQ(daemon.Stop(), 0);
}

// The gRPC path (an older daemon, or a client told not to use the doorbell)
// gives the same bits; one rank on each path in one job works too.
TEST(DaemonE2ETest, OffloadStepsOverTheGrpcFallbackMatchBitForBit) {
  DaemonProcess daemon(TestDir("offload-grpc"));
  ASSERT_TRUE(daemon.Start());
  ClientOptions o;
  o.socket_path = daemon.socket();
  o.rpc_timeout = absl::Seconds(10);
  o.step_timeout = absl::Seconds(30);
  o.use_doorbell = false;
  auto client = StrataClient::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  RunOffloadJob(**client, "offload-grpc", 3, /*doorbell=*/false);
  EXPECT_EQ(daemon.Stop(), 0);
}

// Doorbell signals the daemon refuses are reported by the rank's next call;
// a wild value written into the ring fails that job only, with a message
// naming it, and the daemon keeps serving the other job.
TEST(DaemonE2ETest, DoorbellRefusalsAreReportedAndAWildRingFailsOnlyItsJob) {
  DaemonProcess daemon(TestDir("doorbell-hostile"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  JobSpec spec;
  spec.world_size = 1;
  spec.mode = JobMode::kOffload;
  spec.deepspeed_config_json = kAdamW;
  spec.param_dtype = DType::kFp32;
  spec.grad_dtype = DType::kFp32;
  std::unique_ptr<RankSession> ranks[2];
  for (int j = 0; j < 2; ++j) {
    spec.name = absl::StrCat("bell-", j);
    ASSERT_TRUE(client->CreateJob(spec).ok());
    auto s = client->Attach(spec.name, 0);
    ASSERT_TRUE(s.ok()) << s.status();
    ranks[j] = std::move(*s);
    ASSERT_TRUE(ranks[j]->RegisterTensors(Model()).ok());
    ASSERT_TRUE(ranks[j]->doorbell_active());
    for (ShardView& shard : ranks[j]->shards()) Fill(shard, shard.param, InitialParam);
    ASSERT_TRUE(ranks[j]->InitParams().ok());
  }
  // Mistakes the client can see still fail at once, through gRPC.
  EXPECT_EQ(ranks[0]->GradReady(99, 0).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ranks[0]->GradReady(0, 5).code(), absl::StatusCode::kFailedPrecondition);
  // A step through the doorbell.
  for (ShardView& shard : ranks[0]->shards()) {
    Fill(shard, shard.grad, [&](uint32_t t, uint64_t e) { return Grad(t, e, 0); });
    ASSERT_TRUE(ranks[0]->GradReady(shard.index, 0).ok());
  }
  ASSERT_TRUE(ranks[0]->Flush().ok());
  auto done = ranks[0]->WaitStep(0);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->optimizer_steps, 1u);
  // A hostile trainer of job 1 writes a wild shard index into its ring (the
  // page is found in this process's mappings by its memfd name).
  std::ifstream maps("/proc/self/maps");
  std::string line;
  char* page = nullptr;
  while (std::getline(maps, line)) {
    if (line.find(absl::StrCat("strata-job", ranks[1]->job_id(), "-rank0-doorbell")) == std::string::npos) continue;
    page = reinterpret_cast<char*>(std::stoull(line.substr(0, line.find('-')), nullptr, 16));
  }
  ASSERT_NE(page, nullptr) << "the doorbell page of job bell-1 is not mapped";
  auto* shared = reinterpret_cast<doorbell::Shared*>(page);
  const uint64_t tail = shared->tail.load();
  shared->entries[tail % doorbell::kCapacity].index.store(uint64_t{1} << 40);
  shared->entries[tail % doorbell::kCapacity].step.store(0);
  shared->tail.store(tail + 1);
  // Its next signal rings the daemon, which finds the wild entry first.
  auto blank = [](uint32_t, uint64_t) { return 0.0f; };
  for (ShardView& shard : ranks[1]->shards()) Fill(shard, shard.grad, blank);
  ASSERT_TRUE(ranks[1]->GradReady(0, 0).ok());
  absl::Status failed = ranks[1]->Flush();
  EXPECT_FALSE(failed.ok());
  EXPECT_NE(failed.message().find("shard index 1099511627776"), std::string::npos) << failed;
  auto after = ranks[1]->WaitStep(0);
  EXPECT_FALSE(after.ok()) << "optimizer_steps " << after->optimizer_steps;
  if (!after.ok()) {
    EXPECT_NE(after.status().message().find("shard index"), std::string::npos) << after.status();
  }
  // Job 0 is unharmed.
  for (ShardView& shard : ranks[0]->shards()) {
    Fill(shard, shard.grad, [&](uint32_t t, uint64_t e) { return Grad(t, e, 1); });
    ASSERT_TRUE(ranks[0]->GradReady(shard.index, 1).ok());
  }
  auto next = ranks[0]->WaitStep(1);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->optimizer_steps, 2u);
  ranks[0].reset();
  ranks[1].reset();
  EXPECT_EQ(daemon.Stop(), 0);
}

// fp16 with dynamic loss scaling and clipping: an overflow on one rank skips
// the step on every rank and halves the scale; the next step is applied with
// the gradients unscaled and clipped to the global norm.
TEST(DaemonE2ETest, Fp16OverflowSkipsTheStepEverywhereAndClippingUsesTheGlobalNorm) {
  DaemonProcess daemon(TestDir("fp16"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  JobSpec spec;
  spec.name = "mixed";
  spec.world_size = 2;
  spec.deepspeed_config_json = R"({"zero_optimization": {"stage": 2},
      "fp16": {"enabled": true, "initial_scale_power": 4, "hysteresis": 1},
      "gradient_clipping": 0.5,
      "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})";
  spec.param_dtype = DType::kFp16;
  spec.grad_dtype = DType::kFp16;
  ASSERT_TRUE(client->CreateJob(spec).ok());
  std::vector<std::unique_ptr<RankSession>> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    auto s = client->Attach("mixed", r);
    ASSERT_TRUE(s.ok());
    ranks.push_back(std::move(*s));
    ASSERT_TRUE(ranks[r]->RegisterTensors(Model()).ok());
    ASSERT_EQ(ranks[r]->param_dtype(), DType::kFp16);
  }
  auto fill16 = [](const ShardView& shard, std::byte* base, auto value) {
    uint16_t* out = reinterpret_cast<uint16_t*>(base);
    for (const OwnedRange& r : shard.ranges) {
      for (uint64_t e = 0; e < r.numel; ++e) {
        float v = value(r.tensor.value(), r.tensor_offset + e);
        // fp16 bits via the daemon's own rounding is not reachable here; use
        // values exact in fp16 (multiples of 1/1024 below 2).
        v = std::round(v * 1024.0f) / 1024.0f;
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const uint32_t sign = (bits >> 16) & 0x8000;
        const int exp = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
        uint16_t h = 0;
        if (v != 0 && exp > 0) h = static_cast<uint16_t>(sign | (exp << 10) | ((bits >> 13) & 0x3ff));
        else if (v != 0) h = static_cast<uint16_t>(sign | static_cast<uint16_t>(std::ldexp(std::fabs(v), 24)));
        out[r.shard_offset + e] = h;
      }
    }
  };
  for (uint32_t r = 0; r < 2; ++r) {
    for (ShardView& s : ranks[r]->shards()) fill16(s, s.param, InitialParam);
    ASSERT_TRUE(ranks[r]->InitParams().ok());
  }
  std::vector<uint16_t> before(ranks[0]->shards()[0].padded_numel);
  std::memcpy(before.data(), ranks[0]->shards()[0].param, before.size() * 2);
  // Step 0: rank 1's gradient holds an inf.
  for (uint32_t r = 0; r < 2; ++r) {
    for (ShardView& s : ranks[r]->shards()) {
      fill16(s, s.grad, [](uint32_t t, uint64_t e) { return Grad(t, e, 0) * 16; });
      if (r == 1) reinterpret_cast<uint16_t*>(s.grad)[0] = 0x7c00;  // +inf
      ASSERT_TRUE(ranks[r]->GradReady(s.index, 0).ok());
    }
  }
  for (uint32_t r = 0; r < 2; ++r) {
    auto result = ranks[r]->WaitStep(0);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_TRUE(result->skipped);
    EXPECT_EQ(result->loss_scale, 8.0);  // 2^4 halved
    EXPECT_EQ(result->optimizer_steps, 0u);
  }
  EXPECT_EQ(std::memcmp(before.data(), ranks[0]->shards()[0].param, before.size() * 2), 0)
      << "a skipped step changed params";
  // Step 1: clean gradients scaled by 8; their global norm exceeds the clip.
  for (uint32_t r = 0; r < 2; ++r) {
    for (ShardView& s : ranks[r]->shards()) {
      fill16(s, s.grad, [](uint32_t t, uint64_t e) { return Grad(t, e, 1) * 8; });
      ASSERT_TRUE(ranks[r]->GradReady(s.index, 1).ok());
    }
  }
  auto result = ranks[0]->WaitStep(1);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->skipped);
  EXPECT_EQ(result->optimizer_steps, 1u);
  // The norm the daemon reports is of the unscaled gradients of both ranks.
  double squared = 0;
  std::vector<TensorDesc> model = Model();
  for (uint32_t t = 0; t < model.size(); ++t) {
    for (uint64_t e = 0; e < model[t].numel; ++e) {
      const float g = std::round(Grad(t, e, 1) * 8 * 1024.0f) / 1024.0f / 8;
      squared += static_cast<double>(g) * g;
    }
  }
  EXPECT_NEAR(result->grad_norm, std::sqrt(squared), 1e-3 * std::sqrt(squared));
  EXPECT_GT(result->grad_norm, 0.5);
  EXPECT_NE(std::memcmp(before.data(), ranks[0]->shards()[0].param, before.size() * 2), 0)
      << "an applied step left params unchanged";
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonE2ETest, MetricsAreServedInPrometheusFormatOnLoopback) {
  DaemonProcess daemon(TestDir("metrics"));
  const int port = 20000 + getpid() % 20000;
  ASSERT_TRUE(daemon.Start({"--metrics_port", std::to_string(port)}));
  auto client = daemon.Connect();
  RunOffloadJob(*client, "measured", 2);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
  ASSERT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string body;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) body.append(buf, static_cast<size_t>(n));
  close(fd);
  EXPECT_NE(body.find("strata_job_step{job=\"measured\"} 2"), std::string::npos) << body;
  EXPECT_NE(body.find("strata_tier_capacity_bytes{tier=\"nvme\"}"), std::string::npos) << body;
  // The pinned tier too: the job's region and states are reserved while it lives.
  EXPECT_NE(body.find("strata_tier_capacity_bytes{tier=\"pinned\"}"), std::string::npos) << body;
  EXPECT_EQ(body.find("strata_tier_used_bytes{tier=\"pinned\"} 0\n"), std::string::npos) << body;
  EXPECT_NE(body.find("strata_job_pinned_reserved_bytes{job=\"measured\"} "), std::string::npos) << body;
  EXPECT_EQ(body.find("strata_job_pinned_reserved_bytes{job=\"measured\"} 0\n"), std::string::npos) << body;
  EXPECT_NE(body.find("# TYPE strata_job_last_step_seconds gauge"), std::string::npos);
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonE2ETest, TwoJobsOfTwoRanksRunAtOnce) {
  DaemonProcess daemon(TestDir("twojobs"));
  ASSERT_TRUE(daemon.Start());
  std::thread a([&] {
    auto c = daemon.Connect();
    if (c) RunOffloadJob(*c, "job-a", 4);
  });
  std::thread b([&] {
    auto c = daemon.Connect();
    if (c) RunOffloadJob(*c, "job-b", 4);
  });
  a.join();
  b.join();
  auto client = daemon.Connect();
  auto jobs = client->ListJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 2u);
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonE2ETest, BadRequestsGetClearErrorsAndTheDaemonKeepsServing) {
  DaemonProcess daemon(TestDir("bad"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  // Unknown job.
  auto missing = client->Attach("no-such-job", 0);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no-such-job"), std::string::npos);
  // Bad job specs.
  JobSpec spec;
  spec.name = "bad job name!";
  EXPECT_EQ(client->CreateJob(spec).status().code(), absl::StatusCode::kInvalidArgument);
  spec.name = "j";
  spec.world_size = 2;
  spec.deepspeed_config_json = R"({"gradient_clipping": 0, "zero_optimization": {"stage": 4}})";
  auto bad_stage = client->CreateJob(spec);
  EXPECT_EQ(bad_stage.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_stage.status().message().find("zero_optimization.stage"), std::string::npos);
  spec.deepspeed_config_json = kAdamW;
  spec.param_dtype = DType::kFp32;
  spec.grad_dtype = DType::kFp32;
  ASSERT_TRUE(client->CreateJob(spec).ok());
  EXPECT_EQ(client->CreateJob(spec).status().code(), absl::StatusCode::kAlreadyExists);
  // Rank out of range.
  EXPECT_EQ(client->Attach("j", 7).status().code(), absl::StatusCode::kInvalidArgument);
  auto rank = client->Attach("j", 0);
  ASSERT_TRUE(rank.ok());
  // Step before register.
  auto early = (*rank)->GradReady(0, 0);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  ASSERT_TRUE((*rank)->RegisterTensors(Model()).ok());
  // Wrong sizes from the other rank.
  auto other = client->Attach("j", 1);
  ASSERT_TRUE(other.ok());
  std::vector<TensorDesc> wrong = Model();
  wrong[1].numel = 38;
  auto mismatch = (*other)->RegisterTensors(wrong);
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.message().find("b1"), std::string::npos) << mismatch;
  // GradReady before InitParams, then a shard index out of range.
  EXPECT_EQ((*rank)->GradReady(0, 0).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*rank)->InitParams().ok());
  ASSERT_TRUE((*other)->RegisterTensors(Model()).ok());
  ASSERT_TRUE((*other)->InitParams().ok());
  EXPECT_EQ((*rank)->GradReady(99, 0).code(), absl::StatusCode::kOutOfRange);
  // A step from the future.
  EXPECT_EQ((*rank)->GradReady(0, 5).code(), absl::StatusCode::kFailedPrecondition);
  // An oversized message.
  std::vector<TensorDesc> huge;
  for (int i = 0; i < 100000; ++i) huge.push_back({std::string(60, 'x') + std::to_string(i), 1});
  JobSpec huge_spec;
  huge_spec.name = "huge";
  huge_spec.deepspeed_config_json = kAdamW;
  auto third = client->CreateJob(huge_spec);
  ASSERT_TRUE(third.ok());
  auto huge_rank = client->Attach("huge", 0);
  ASSERT_TRUE(huge_rank.ok());
  EXPECT_EQ((*huge_rank)->RegisterTensors(huge).code(), absl::StatusCode::kResourceExhausted);
  // Garbage on the fd socket.
  {
    auto sock = ConnectUnix(daemon.socket() + ".fd");
    ASSERT_TRUE(sock.ok());
    ASSERT_TRUE(SendWithFds(sock->get(), "garbage-token", {}).ok());
    auto reply = ReceiveWithFds(sock->get(), 1024, absl::Seconds(5));
    ASSERT_TRUE(reply.ok());
    EXPECT_EQ(reply->bytes.rfind("ERR", 0), 0u) << reply->bytes;
    EXPECT_TRUE(reply->fds.empty());
  }
  // Still serving.
  EXPECT_TRUE(client->Noop().ok());
  EXPECT_TRUE(daemon.running());
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonE2ETest, AClientOfAnotherUidIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to setuid to nobody";
  passwd* nobody = getpwnam("nobody");
  if (nobody == nullptr) GTEST_SKIP() << "no user 'nobody' here";
  const std::string dir = TestDir("uid");
  DaemonProcess daemon(dir);
  ASSERT_TRUE(daemon.Start());
  // The socket's directory must be reachable by the other user for the test
  // to reach the uid check rather than a permission error on the path.
  chmod(dir.c_str(), 0755);
  chmod(daemon.socket().c_str(), 0666);
  pid_t child = fork();
  if (child == 0) {
    if (setgid(nobody->pw_gid) != 0 || setuid(nobody->pw_uid) != 0) _exit(3);
    ClientOptions o;
    o.socket_path = daemon.socket();
    o.rpc_timeout = absl::Seconds(3);
    auto c = StrataClient::Connect(o);
    _exit(c.ok() ? 1 : 0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "a client running as nobody was served";
  EXPECT_TRUE(daemon.Connect()->Noop().ok());
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonE2ETest, ARankKilledMidStepCanReattachAndTheOtherJobIsUnharmed) {
  DaemonProcess daemon(TestDir("kill"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  JobSpec spec;
  spec.name = "victim";
  spec.world_size = 2;
  // Sub-groups of 4096 elements: each rank has several shards, so rank 1 can
  // die having sent only part of its gradient.
  spec.deepspeed_config_json =
      R"({"gradient_clipping": 0, "zero_optimization": {"stage": 2, "sub_group_size": 4096}, "optimizer": {"type": "AdamW"}})";
  spec.param_dtype = DType::kFp32;
  spec.grad_dtype = DType::kFp32;
  ASSERT_TRUE(client->CreateJob(spec).ok());
  auto rank0 = client->Attach("victim", 0);
  ASSERT_TRUE(rank0.ok());
  ASSERT_TRUE((*rank0)->RegisterTensors(Model()).ok());
  for (ShardView& s : (*rank0)->shards()) Fill(s, s.param, InitialParam);
  ASSERT_TRUE((*rank0)->InitParams().ok());
  ASSERT_GT((*rank0)->shards().size(), 1u);
  // Rank 1 in its own process: initializes, sends part of step 0, is killed.
  int ready_pipe[2];
  ASSERT_EQ(pipe(ready_pipe), 0);
  pid_t child = fork();
  if (child == 0) {
    dup2(ready_pipe[1], STDOUT_FILENO);
    std::string rank_bin = BuildDir() + "/tests/strata-test-rank";
    std::string socket = daemon.socket();
    execl(rank_bin.c_str(), rank_bin.c_str(), socket.c_str(), "victim", "1", static_cast<char*>(nullptr));
    _exit(127);
  }
  char ready[6] = {};
  ASSERT_EQ(read(ready_pipe[0], ready, 5), 5) << "the rank process did not get ready";
  ASSERT_STREQ(ready, "ready");
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  // Another job runs fine meanwhile.
  RunOffloadJob(*client, "bystander", 2);
  // Rank 0 finishes its part of step 0; the step waits for rank 1.
  for (ShardView& s : (*rank0)->shards()) {
    Fill(s, s.grad, [](uint32_t t, uint64_t e) { return Grad(t, e, 0); });
    ASSERT_TRUE((*rank0)->GradReady(s.index, 0).ok());
  }
  // Rank 1 comes back: its state is intact and it redoes step 0.
  auto again = client->Attach("victim", 1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)->reattached());
  ASSERT_TRUE((*again)->RegisterTensors(Model()).ok());
  for (ShardView& s : (*again)->shards()) {
    Fill(s, s.grad, [](uint32_t t, uint64_t e) { return Grad(t, e, 0); });
    ASSERT_TRUE((*again)->GradReady(s.index, 0).ok());
  }
  auto result = (*again)->WaitStep(0);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->optimizer_steps, 1u);
  EXPECT_TRUE(daemon.running());
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonE2ETest, CheckpointRoundTripIsBitForBit) {
  const std::string dir = TestDir("ckpt");
  DaemonProcess daemon(dir);
  // Checkpoints live beneath --checkpoint_root (absolute paths inside it work).
  const std::string root = dir + "/ckroot";
  ASSERT_TRUE(daemon.Start({"--checkpoint_root", root}));
  auto client = daemon.Connect();
  RunOffloadJob(*client, "saved", 2);
  ASSERT_TRUE(client->SaveCheckpoint("saved", root + "/ckpt").ok());
  EXPECT_EQ(client->SaveCheckpoint("saved", root + "/ckpt").code(), absl::StatusCode::kAlreadyExists);
  auto loaded = client->LoadCheckpoint(root + "/ckpt", "restored");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(client->SaveCheckpoint("restored", root + "/ckpt2").ok());
  for (const auto& entry : std::filesystem::directory_iterator(root + "/ckpt")) {
    const std::string name = entry.path().filename();
    if (name == "manifest.json") continue;
    std::ifstream a(entry.path(), std::ios::binary), b(root + "/ckpt2/" + name, std::ios::binary);
    std::string da((std::istreambuf_iterator<char>(a)), {}), db((std::istreambuf_iterator<char>(b)), {});
    EXPECT_FALSE(da.empty());
    EXPECT_EQ(da, db) << name;
  }
  // The restored job continues from the same step.
  auto jobs = client->ListJobs();
  ASSERT_TRUE(jobs.ok());
  for (const JobSummary& j : *jobs) EXPECT_EQ(j.step, 2u) << j.name;
  EXPECT_EQ(client->LoadCheckpoint(root + "/nope", "x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(daemon.Stop(), 0);
}

}  // namespace
}  // namespace strata
