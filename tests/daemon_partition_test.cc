// Trainer-supplied partitions end to end: the trainer (as DeepSpeed or FSDP
// does) decides which elements each rank owns; the daemon steps exactly those,
// bit for bit as the CPU optimizer does per tensor, and refuses partitions
// that are out of range, overlap, or leave elements unowned.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>

#include "optimizer_cpu/cpu_optimizer.h"
#include "tests/daemon_fixture.h"

namespace strata {
namespace {

std::string TestDir(const std::string& name) { return MakeTestDir("partition", name); }

std::vector<TensorDesc> Model() { return {{"w1", 5000, 0}, {"b1", 37, 1}, {"w2", 12001, 0}}; }

float InitialParam(uint32_t t, uint64_t e) { return std::sin(0.001f * (e + 1) + t); }
float Grad(uint32_t t, uint64_t e, uint64_t step) { return std::cos(0.01f * e + t + 0.5f * step) * 0.1f; }

std::vector<GroupHyperparams> Groups(int step) {
  return {GroupHyperparams{0.01 / (step + 1), 0.9, 0.999, 1e-8, 0.1, 0},
          GroupHyperparams{0.03 / (step + 1), 0.9, 0.999, 1e-8, 0.0, 0}};
}

// FSDP-like: every tensor is cut in two, rank 0 owning the first half.
// flat: one shard per rank holding its halves back to back (stage 1/2);
// else one shard per tensor (stage 3), padded to 64 elements.
std::vector<ShardLayoutSpec> Halves(uint32_t rank, bool flat) {
  std::vector<TensorDesc> model = Model();
  std::vector<ShardLayoutSpec> shards;
  uint64_t offset = 0;
  for (uint32_t t = 0; t < model.size(); ++t) {
    const uint64_t first = model[t].numel / 2;
    const uint64_t lo = rank == 0 ? 0 : first;
    const uint64_t n = rank == 0 ? first : model[t].numel - first;
    if (flat) {
      if (shards.empty()) shards.push_back(ShardLayoutSpec{0, 0, {}});
      shards[0].ranges.push_back(OwnedRange{TensorId(t), lo, n, offset});
      offset += n + 3;  // a gap of padding between tensors
      shards[0].padded_numel = (offset + 63) / 64 * 64;
    } else {
      shards.push_back(ShardLayoutSpec{t, (n + 63) / 64 * 64, {OwnedRange{TensorId(t), lo, n, 0}}});
    }
  }
  return shards;
}

std::vector<std::vector<float>> Reference(int steps) {
  auto opt = CpuOptimizer::Create({});
  std::vector<TensorDesc> model = Model();
  std::vector<std::vector<float>> out;
  for (uint32_t t = 0; t < model.size(); ++t) {
    const uint64_t n = model[t].numel;
    std::vector<float> p(n), m(n, 0), v(n, 0), g(n);
    for (uint64_t e = 0; e < n; ++e) p[e] = InitialParam(t, e);
    for (int step = 0; step < steps; ++step) {
      const GroupHyperparams in = Groups(step)[model[t].group];
      OptimizerHyperparams hp;
      hp.kind = OptimizerKind::kAdamW;
      hp.lr = in.lr;
      hp.beta1 = in.beta1;
      hp.beta2 = in.beta2;
      hp.eps = in.eps;
      hp.weight_decay = in.weight_decay;
      for (uint64_t e = 0; e < n; ++e) g[e] = Grad(t, e, step);
      StepSpans spans;
      spans.size = n;
      spans.params = p.data();
      spans.exp_avg = m.data();
      spans.exp_avg_sq = v.data();
      spans.grad = g.data();
      EXPECT_TRUE((*opt)->Step(hp, step + 1, spans).ok());
    }
    out.push_back(std::move(p));
  }
  return out;
}

template <typename Fn>
void Fill(const ShardView& shard, std::byte* base, Fn value) {
  float* out = reinterpret_cast<float*>(base);
  for (const OwnedRange& r : shard.ranges) {
    for (uint64_t e = 0; e < r.numel; ++e) out[r.shard_offset + e] = value(r.tensor.value(), r.tensor_offset + e);
  }
}

JobSpec Spec(const std::string& name, bool infinity) {
  JobSpec spec;
  spec.name = name;
  spec.world_size = 2;
  spec.mode = infinity ? JobMode::kInfinity : JobMode::kOffload;
  spec.deepspeed_config_json =
      infinity ? R"({"gradient_clipping": 0, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x"},
                     "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}},
                     "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"
               : R"({"gradient_clipping": 0, "zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})";
  spec.param_dtype = DType::kFp32;
  spec.grad_dtype = DType::kFp32;
  if (infinity) spec.pinned_budget_bytes = 128 << 10;
  return spec;
}

void RunSupplied(StrataClient& client, const std::string& name, bool infinity, bool flat) {
  ASSERT_TRUE(client.CreateJob(Spec(name, infinity)).ok());
  std::vector<std::unique_ptr<RankSession>> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    auto s = client.Attach(name, r);
    ASSERT_TRUE(s.ok()) << s.status();
    ranks.push_back(std::move(*s));
    const std::vector<ShardLayoutSpec> mine = Halves(r, flat);
    absl::Status registered = ranks[r]->RegisterTensors(Model(), mine);
    ASSERT_TRUE(registered.ok()) << registered;
    // The daemon follows the trainer's partition.
    ASSERT_EQ(ranks[r]->shards().size(), mine.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      EXPECT_EQ(ranks[r]->shards()[i].padded_numel, mine[i].padded_numel);
      EXPECT_EQ(ranks[r]->shards()[i].ranges.size(), mine[i].ranges.size());
    }
    for (ShardView& shard : ranks[r]->shards()) Fill(shard, shard.param, InitialParam);
  }
  std::thread other([&] { ASSERT_TRUE(ranks[1]->InitParams().ok()); });
  ASSERT_TRUE(ranks[0]->InitParams().ok());
  other.join();
  constexpr int kSteps = 3;
  for (int step = 0; step < kSteps; ++step) {
    for (auto& rank : ranks) {
      ASSERT_TRUE(rank->BeginStep(step, Groups(step)).ok());
      if (infinity) {
        for (const ShardView& shard : rank->shards()) {
          ASSERT_TRUE(rank->Acquire({shard.index}).ok());
          ASSERT_TRUE(rank->Release({shard.index}).ok());
        }
        ASSERT_TRUE(rank->IterationBoundary().ok());
      }
      for (ShardView& shard : rank->shards()) {
        Fill(shard, shard.grad, [&](uint32_t t, uint64_t e) { return Grad(t, e, step); });
        ASSERT_TRUE(rank->GradReady(shard.index, step).ok());
      }
    }
    for (auto& rank : ranks) ASSERT_TRUE(rank->WaitStep(step).ok());
  }
  const std::vector<std::vector<float>> expected = Reference(kSteps);
  std::vector<uint64_t> checked(Model().size(), 0);
  for (uint32_t r = 0; r < 2; ++r) {
    for (const ShardView& shard : ranks[r]->shards()) {
      if (infinity) {
        ASSERT_TRUE(ranks[r]->Acquire({shard.index}).ok());
      }
      const float* got = reinterpret_cast<const float*>(shard.param);
      for (const OwnedRange& range : shard.ranges) {
        for (uint64_t e = 0; e < range.numel; ++e) {
          ASSERT_EQ(got[range.shard_offset + e], expected[range.tensor.value()][range.tensor_offset + e])
              << name << " rank " << r << " tensor " << range.tensor.value() << " element " << range.tensor_offset + e;
        }
        checked[range.tensor.value()] += range.numel;
      }
      if (infinity) {
        ASSERT_TRUE(ranks[r]->Release({shard.index}).ok());
      }
    }
  }
  for (uint32_t t = 0; t < Model().size(); ++t) EXPECT_EQ(checked[t], Model()[t].numel);
}

TEST(DaemonPartitionTest, SuppliedPartitionsStepBitForBitInOffloadAndInfinity) {
  const std::string dir = TestDir("ok");
  CleanDaemon daemon(dir);
  ASSERT_TRUE(daemon.Start({"--checkpoint_root", dir}));  // checkpoints live beneath it
  auto client = daemon.Connect();
  RunSupplied(*client, "flat", /*infinity=*/false, /*flat=*/true);
  RunSupplied(*client, "per-tensor", /*infinity=*/true, /*flat=*/false);
  // Infinity with one shard of all tensors: the NVMe tile pipeline steps
  // runs of both groups within a shard.
  RunSupplied(*client, "inf-flat", /*infinity=*/true, /*flat=*/true);
  // A checkpoint keeps the supplied partitions: loaded and saved again, it is
  // the same bytes.
  ASSERT_TRUE(client->SaveCheckpoint("flat", dir + "/ckpt").ok());
  auto loaded = client->LoadCheckpoint(dir + "/ckpt", "flat-again");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE(client->SaveCheckpoint("flat-again", dir + "/ckpt2").ok());
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/ckpt")) {
    const std::string name = entry.path().filename();
    std::ifstream a(entry.path(), std::ios::binary), b(dir + "/ckpt2/" + name, std::ios::binary);
    std::string da((std::istreambuf_iterator<char>(a)), {}), db((std::istreambuf_iterator<char>(b)), {});
    if (name == "manifest.json") {
      EXPECT_NE(da.find("partitions"), std::string::npos);
      continue;
    }
    EXPECT_EQ(da, db) << name;
    ++files;
  }
  EXPECT_EQ(files, 2);  // one flat shard per rank
  auto again = client->Attach("flat-again", 1);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)->RegisterTensors(Model(), Halves(1, true)).ok());
  EXPECT_EQ((*again)->RegisterTensors(Model(), Halves(0, true)).code(), absl::StatusCode::kFailedPrecondition)
      << "a mapped session registers once";
  auto other = client->Attach("flat-again", 0);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->RegisterTensors(Model(), Halves(1, true)).code(), absl::StatusCode::kInvalidArgument)
      << "rank 0 registered another partition before";
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonPartitionTest, BadPartitionsAreRefusedNamingTheProblem) {
  CleanDaemon daemon(TestDir("bad"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_TRUE(client->CreateJob(Spec("job", false)).ok());
  auto r0 = client->Attach("job", 0);
  auto r1 = client->Attach("job", 1);
  ASSERT_TRUE(r0.ok() && r1.ok());
  auto refused = [&](RankSession& rank, std::vector<ShardLayoutSpec> partition, const std::string& words) {
    absl::Status s = rank.RegisterTensors(Model(), partition);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(words), std::string::npos) << "wanted '" << words << "' in: " << s;
  };
  std::vector<ShardLayoutSpec> p = Halves(0, true);
  p[0].ranges[0].numel += 5000;  // past the end of w1
  refused(**r0, p, "covers elements");
  p = Halves(0, true);
  p[0].ranges[1].tensor_offset = UINT64_MAX - 2;  // overflow-safe
  refused(**r0, p, "covers elements");
  p = Halves(0, true);
  p[0].ranges[2].tensor = TensorId(7);
  refused(**r0, p, "names tensor 7");
  p = Halves(0, true);
  p[0].index = 3;
  refused(**r0, p, "must have index");
  p = Halves(0, true);
  p[0].ranges.back().shard_offset = p[0].padded_numel - 1;
  refused(**r0, p, "overruns");
  p = Halves(0, true);
  std::swap(p[0].ranges[0], p[0].ranges[1]);
  refused(**r0, p, "sorted by shard_offset");
  p = Halves(0, true);
  p[0].ranges.push_back(OwnedRange{TensorId(0), 10, 5, p[0].padded_numel});
  p[0].padded_numel += 64;
  refused(**r0, p, "overlapping");
  p = Halves(0, true);
  p[0].padded_numel = UINT64_MAX;
  refused(**r0, p, "padded_numel");
  // A good partition for rank 0; rank 1 then may neither overlap it, nor
  // leave elements unowned, nor send none.
  ASSERT_TRUE((*r0)->RegisterTensors(Model(), Halves(0, true)).ok());
  p = Halves(1, true);
  p[0].ranges[0].tensor_offset -= 1;
  refused(**r1, p, "owned by rank 0");
  p = Halves(1, true);
  p[0].ranges[1].numel -= 1;
  refused(**r1, p, "owned by no rank");
  refused(**r1, {}, "every rank must do the same");
  // The same session may still register correctly, and the job runs.
  ASSERT_TRUE((*r1)->RegisterTensors(Model(), Halves(1, true)).ok());
  std::thread other([&] { ASSERT_TRUE((*r1)->InitParams().ok()); });
  ASSERT_TRUE((*r0)->InitParams().ok());
  other.join();
  // A job whose first rank lets the daemon partition refuses a partition later.
  ASSERT_TRUE(client->CreateJob(Spec("daemon-made", false)).ok());
  auto d0 = client->Attach("daemon-made", 0);
  auto d1 = client->Attach("daemon-made", 1);
  ASSERT_TRUE(d0.ok() && d1.ok());
  ASSERT_TRUE((*d0)->RegisterTensors(Model()).ok());
  refused(**d1, Halves(1, true), "every rank must do the same");
  EXPECT_TRUE(daemon.running());
  EXPECT_EQ(daemon.Stop(), 0);
}

}  // namespace
}  // namespace strata
