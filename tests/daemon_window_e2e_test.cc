// ZeRO-Infinity's window end to end: a job whose pinned budget is well below
// its params + gradients trains with the same bits as one with no budget,
// while its exchange region (the memfd shared with the trainer) holds no more
// memory than the budget once the daemon has taken each gradient in, and at
// most two more slots at any time (see the expectations).

#include <atomic>
#include <cstdio>
#include <cmath>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/daemon_fixture.h"

namespace strata {
namespace {

constexpr uint32_t kTensors = 8;
constexpr uint64_t kNumel = 32768;           // 128 KiB of fp32 per slot
constexpr uint64_t kSlotBytes = kNumel * 4;
constexpr uint64_t kBudget = 3 * kSlotBytes;  // 384 KiB for 1 MiB of params and 1 MiB of gradients

std::vector<TensorDesc> Model() {
  std::vector<TensorDesc> m;
  for (uint32_t t = 0; t < kTensors; ++t) m.push_back({absl::StrCat("layer", t), kNumel});
  return m;
}

JobSpec Spec(const std::string& name, uint64_t budget) {
  JobSpec spec;
  spec.name = name;
  spec.world_size = 1;
  spec.mode = JobMode::kInfinity;
  spec.deepspeed_config_json =
      R"({"gradient_clipping": 0, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"},
          "offload_optimizer": {"device": "nvme"}}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01,
          "weight_decay": 0.1}}})";
  spec.param_dtype = DType::kFp32;
  spec.grad_dtype = DType::kFp32;
  spec.pinned_budget_bytes = budget;
  return spec;
}

// The rank's region in memory now (mincore: the memfd's pages, whoever
// faulted them in); UINT64_MAX when it cannot be read, which fails any bound.
uint64_t Resident(const RankSession& rank) { return rank.ResidentRegionBytes().value_or(UINT64_MAX); }

float Initial(uint64_t t, uint64_t e) { return std::sin(0.001f * static_cast<float>(e + 1) + static_cast<float>(t)); }
float Grad(uint64_t t, uint64_t e, int step) {
  return std::cos(0.01f * static_cast<float>(e) + static_cast<float>(t) + 0.5f * static_cast<float>(step)) * 0.1f;
}

// Every shard's param slot, all at once (shard i element e: Initial(i, e)).
void WriteInitialParams(RankSession& rank) {
  for (ShardView& shard : rank.shards()) {
    float* p = reinterpret_cast<float*>(shard.param);
    for (uint64_t e = 0; e < shard.padded_numel; ++e) p[e] = Initial(shard.index, e);
  }
}

struct TrainRun {
  bool batched_init = false;                    // InitParamsInBatches (else one InitParams)
  uint64_t init_batch_bytes = 0;                // what the daemon asked for
  uint64_t peak_in_init = 0;                    // the region while the params came in
  std::vector<std::vector<float>> params_seen;  // per step and shard, as forward read them
  uint64_t peak_after_grad = 0;                 // the region once each gradient was taken in
  uint64_t peak_in_step = 0;                    // sampled while the daemon stepped
  uint64_t peak_any = 0;
};

// Waits (up to 10 s) for the region to drop to `limit`; returns what it holds then.
uint64_t SettleTo(const RankSession& rank, uint64_t limit) {
  uint64_t now = Resident(rank);
  for (int i = 0; i < 1000 && now > limit; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    now = Resident(rank);
  }
  return now;
}

void Train(StrataClient& client, const std::string& name, uint64_t settle_limit, int steps, TrainRun* out) {
  auto session = client.Attach(name, 0);
  ASSERT_TRUE(session.ok()) << session.status();
  RankSession& rank = **session;
  ASSERT_TRUE(rank.RegisterTensors(Model()).ok());
  ASSERT_EQ(rank.shards().size(), kTensors);
  ASSERT_TRUE(rank.ResidentRegionBytes().ok()) << rank.ResidentRegionBytes().status();
  out->init_batch_bytes = rank.init_batch_bytes();
  auto write = [&](ShardView& shard) {
    float* p = reinterpret_cast<float*>(shard.param);
    for (const OwnedRange& r : shard.ranges) {
      for (uint64_t e = 0; e < r.numel; ++e) p[r.shard_offset + e] = Initial(r.tensor.value(), r.tensor_offset + e);
    }
    // Each slot written so far, the daemon having taken the batches before.
    out->peak_in_init = std::max(out->peak_in_init, Resident(rank));
    return absl::OkStatus();
  };
  if (out->batched_init) {
    ASSERT_TRUE(rank.InitParamsInBatches(write).ok());
  } else {
    for (ShardView& shard : rank.shards()) ASSERT_TRUE(write(shard).ok());
    ASSERT_TRUE(rank.InitParams().ok());
  }
  out->peak_in_init = std::max(out->peak_in_init, Resident(rank));
  for (int step = 0; step < steps; ++step) {
    // Forward: every layer's params, in order.
    for (uint32_t i = 0; i < kTensors; ++i) {
      ASSERT_TRUE(rank.Acquire({i}).ok());
      const float* p = reinterpret_cast<const float*>(rank.shards()[i].param);
      out->params_seen.emplace_back(p, p + kNumel);
      ASSERT_TRUE(rank.Release({i}).ok());
      out->peak_any = std::max(out->peak_any, Resident(rank));
    }
    ASSERT_TRUE(rank.IterationBoundary().ok());
    // Backward: layers in reverse, each gradient signalled as it is made.
    for (uint32_t i = kTensors; i-- > 0;) {
      ASSERT_TRUE(rank.Acquire({i}).ok());
      ASSERT_TRUE(rank.Release({i}).ok());
      ShardView& shard = rank.shards()[i];
      float* g = reinterpret_cast<float*>(shard.grad);
      for (const OwnedRange& r : shard.ranges) {
        for (uint64_t e = 0; e < r.numel; ++e) g[r.shard_offset + e] = Grad(r.tensor.value(), r.tensor_offset + e, step);
      }
      out->peak_any = std::max(out->peak_any, Resident(rank));
      ASSERT_TRUE(rank.GradReady(i, step).ok());
      ASSERT_TRUE(rank.Flush().ok());
      if (i > 0) out->peak_after_grad = std::max(out->peak_after_grad, SettleTo(rank, settle_limit));
    }
    std::atomic<bool> stepping{true};
    uint64_t peak = 0;
    std::thread sampler([&] {
      while (stepping.load()) {
        peak = std::max(peak, Resident(rank));
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
    auto result = rank.WaitStep(step);
    stepping = false;
    sampler.join();
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_FALSE(result->skipped);
    out->peak_in_step = std::max(out->peak_in_step, peak);
    out->peak_any = std::max(out->peak_any, peak);
  }
}

TEST(DaemonWindowTest, ABudgetBelowParamsAndGradsTrainsTheSameBitsInBoundedMemory) {
  DaemonProcess daemon(MakeTestDir("window", "bounded"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateJob(Spec("unbounded", 0)).ok());
  ASSERT_TRUE(client->CreateJob(Spec("bounded", kBudget)).ok());
  constexpr int kSteps = 4;
  TrainRun unbounded, bounded;
  bounded.batched_init = true;  // as strata.torch and the examples do
  Train(*client, "unbounded", UINT64_MAX, kSteps, &unbounded);
  Train(*client, "bounded", kBudget, kSteps, &bounded);
  if (HasFatalFailure()) return;
  // The same bits at every step: the window changes where bytes live, not them.
  ASSERT_EQ(bounded.params_seen.size(), unbounded.params_seen.size());
  for (size_t i = 0; i < bounded.params_seen.size(); ++i) {
    ASSERT_EQ(std::memcmp(bounded.params_seen[i].data(), unbounded.params_seen[i].data(), kSlotBytes), 0)
        << "step " << i / kTensors << " shard " << i % kTensors;
  }
  // The params do change (the comparison above is not of two untouched copies).
  EXPECT_NE(std::memcmp(bounded.params_seen.front().data(), bounded.params_seen[kTensors].data(), kSlotBytes), 0);
  // Without a budget everything stays up; with one, memory stays within it
  // once each gradient is taken in (spilled to NVMe when params alone cannot
  // make room), and within it plus the param slot being written in the step.
  std::printf("region resident peaks: unbounded %lu; bounded (budget %lu) after each gradient %lu, in the step %lu, "
              "anywhere %lu bytes\n", static_cast<unsigned long>(unbounded.peak_any), static_cast<unsigned long>(kBudget),
              static_cast<unsigned long>(bounded.peak_after_grad), static_cast<unsigned long>(bounded.peak_in_step),
              static_cast<unsigned long>(bounded.peak_any));
  // (Every param stays up unbounded, and the gradients until they are
  // stepped: those stepped early leave their slots at once.)
  EXPECT_GE(unbounded.peak_any, kTensors * kSlotBytes + kSlotBytes);
  EXPECT_LE(bounded.peak_after_grad, kBudget);
  // The params came in batches of the budget and the daemon kept none of a
  // batch in the window when the next one came: the model (8 slots) never
  // sat in memory at once. Without a budget there is no limit and no batches.
  std::printf("init: batch %lu bytes, region peak %lu (unbounded %lu)\n",
              static_cast<unsigned long>(bounded.init_batch_bytes), static_cast<unsigned long>(bounded.peak_in_init),
              static_cast<unsigned long>(unbounded.peak_in_init));
  EXPECT_EQ(bounded.init_batch_bytes, kBudget);
  EXPECT_EQ(unbounded.init_batch_bytes, 0u);
  EXPECT_LE(bounded.peak_in_init, kBudget);
  EXPECT_GE(unbounded.peak_in_init, kTensors * kSlotBytes);
  // The trainer's own write of a gradient comes on top until the daemon takes
  // it in, and so does a param its Acquire read when the gradients in their
  // slots left no room (a demand read goes over budget rather than stall):
  // the sampling of the step starts right after the last gradient, so it sees
  // those two; the step itself adds one param slot at a time (written, stored
  // home, dropped), which never stacks on top of them.
  EXPECT_LE(bounded.peak_in_step, kBudget + 2 * kSlotBytes);
  EXPECT_LE(bounded.peak_any, kBudget + 2 * kSlotBytes);
  // `strata stats` shows each job's window: its budget, what it holds, the
  // acquires' hits and misses, and the NVMe traffic the budget cost.
  auto stats = client->StatsText();
  ASSERT_TRUE(stats.ok()) << stats.status();
  std::printf("%s", stats->c_str());
  const size_t at = stats->find("  bounded ");
  ASSERT_NE(at, std::string::npos) << *stats;
  const std::string bounded_text = stats->substr(at);
  EXPECT_NE(bounded_text.find(absl::StrCat(" of ", kBudget, " B  hits ")), std::string::npos) << bounded_text;
  const size_t nvme = bounded_text.find("    nvme     read ");
  ASSERT_NE(nvme, std::string::npos) << bounded_text;
  EXPECT_EQ(bounded_text.substr(nvme, bounded_text.find('\n', nvme) - nvme).find("written 0 B"), std::string::npos)
      << bounded_text;  // params stored home, gradients spilled
  // The job exports its NVMe staging (what bench/offload_parts measures
  // against): tiles no bigger than its largest shard (one 128 KiB slot of
  // fp32 here, well under the daemon's 64 MiB tile), three sets of AdamW's
  // three state streams.
  auto jobs = client->ListJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  for (const JobSummary& job : *jobs) {
    EXPECT_EQ(job.nvme_tile_bytes, kSlotBytes) << job.name;
    EXPECT_EQ(job.nvme_staging_bytes, 3 * 3 * kSlotBytes) << job.name;
  }
  EXPECT_EQ(daemon.Stop(), 0);
}

// InitParams with a shard list comes from the trainer: an index out of range
// or named twice is refused, naming it, before anything is initialized; the
// rank takes gradients only once every shard has been initialized, whatever
// the batches.
TEST(DaemonWindowTest, InitParamsInBatchesChecksTheListAndCountsEveryShard) {
  DaemonProcess daemon(MakeTestDir("window", "init_batches"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateJob(Spec("batches", kBudget)).ok());
  auto session = client->Attach("batches", 0);
  ASSERT_TRUE(session.ok()) << session.status();
  RankSession& rank = **session;
  ASSERT_TRUE(rank.RegisterTensors(Model()).ok());
  WriteInitialParams(rank);
  absl::Status out_of_range = rank.InitParams({0, kTensors});
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kInvalidArgument) << out_of_range;
  EXPECT_NE(out_of_range.message().find(absl::StrCat("shard index ", kTensors, " is out of range")), std::string::npos)
      << out_of_range;
  absl::Status huge = rank.InitParams({UINT32_MAX});
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument) << huge;
  absl::Status twice = rank.InitParams({1, 2, 1});
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument) << twice;
  EXPECT_NE(twice.message().find("listed twice"), std::string::npos) << twice;
  // Refused lists initialized nothing: with half the shards in, the rank is
  // not initialized yet (no Acquire, no gradients).
  ASSERT_TRUE(rank.InitParams({0, 1, 2, 3}).ok());
  absl::Status early = rank.Acquire({0});
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
  // A shard sent again before any step is initialized again (same bits).
  ASSERT_TRUE(rank.InitParams({3, 4, 5}).ok());
  EXPECT_EQ(rank.Acquire({0}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(rank.InitParams({7, 6}).ok());
  ASSERT_TRUE(rank.Acquire({0}).ok());
  const float* p = reinterpret_cast<const float*>(rank.shards()[0].param);
  EXPECT_EQ(p[5], Initial(0, 5));
  ASSERT_TRUE(rank.Release({0}).ok());
  EXPECT_EQ(daemon.Stop(), 0);
}

// GetStats' last_step: where the daemon says the step went. Its parts are
// measured inside the step the trainer waited for, so they fit in the
// trainer's wall time around it; the stream holds the waits, the optimizer
// and the hooks; a job that never stepped reports zeros.
TEST(DaemonWindowTest, StatsBreakDownTheLastStep) {
  DaemonProcess daemon(MakeTestDir("window", "breakdown"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateJob(Spec("idle", 0)).ok());
  ASSERT_TRUE(client->CreateJob(Spec("stepped", kBudget)).ok());
  auto idle = client->LastStep("idle");
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_EQ(idle->total_s(), 0);
  EXPECT_EQ(idle->load_wait_s + idle->save_wait_s + idle->optimizer_s + idle->grads_back_s + idle->params_home_s, 0);
  EXPECT_EQ(client->LastStep("no-such-job").status().code(), absl::StatusCode::kNotFound);

  auto session = client->Attach("stepped", 0);
  ASSERT_TRUE(session.ok()) << session.status();
  RankSession& rank = **session;
  ASSERT_TRUE(rank.RegisterTensors(Model()).ok());
  WriteInitialParams(rank);
  ASSERT_TRUE(rank.InitParams().ok());
  constexpr double kEpsilon = 0.02;  // two clocks read at slightly different moments
  for (int step = 0; step < 2; ++step) {
    // Idle time between steps belongs to no step: the gradients-in phase
    // starts at the next step's first gradient.
    if (step > 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const absl::Time start = absl::Now();
    for (ShardView& shard : rank.shards()) {
      float* g = reinterpret_cast<float*>(shard.grad);
      for (uint64_t e = 0; e < shard.padded_numel; ++e) g[e] = Grad(shard.index, e, step);
      ASSERT_TRUE(rank.GradReady(shard.index, step).ok());
    }
    auto result = rank.WaitStep(step);
    const double wall = absl::ToDoubleSeconds(absl::Now() - start);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_FALSE(result->skipped);
    auto b = client->LastStep("stepped");
    ASSERT_TRUE(b.ok()) << b.status();
    std::printf("step %d: wall %.4f s; daemon: gradients in %.4f, stream %.4f (load wait %.4f, save wait %.4f, "
                "optimizer %.4f, grads back %.4f, params home %.4f), end %.4f, commit %.4f s\n",
                step, wall, b->gradients_in_s, b->stream_s, b->load_wait_s, b->save_wait_s, b->optimizer_s,
                b->grads_back_s, b->params_home_s, b->end_s, b->commit_s);
    EXPECT_GT(b->stream_s, 0);
    EXPECT_GT(b->optimizer_s, 0);
    EXPECT_GE(b->gradients_in_s, 0);
    EXPECT_GE(b->load_wait_s, 0);
    EXPECT_GE(b->save_wait_s, 0);
    EXPECT_GE(b->grads_back_s, 0);
    EXPECT_GT(b->params_home_s, 0);  // Infinity stores every shard's new params home
    EXPECT_GT(b->commit_s, 0);       // and commits the step
    EXPECT_LE(b->total_s(), wall + kEpsilon);
    EXPECT_LE(b->load_wait_s + b->save_wait_s + b->optimizer_s + b->grads_back_s + b->params_home_s,
              b->stream_s + kEpsilon);
    // The window (3 slots for 8 gradients, all sent at once) spilled
    // gradients: this step's, each read back by the step -- not the job's
    // total so far, which by step 1 would be more than one step's 8 slots.
    std::printf("step %d: gradients spilled %llu B, read back %llu B\n", step,
                static_cast<unsigned long long>(b->grad_bytes_spilled),
                static_cast<unsigned long long>(b->grad_bytes_read_back));
    EXPECT_GT(b->grad_bytes_spilled, 0u);
    EXPECT_EQ(b->grad_bytes_spilled % kSlotBytes, 0u);
    EXPECT_LE(b->grad_bytes_spilled, kTensors * kSlotBytes);
    EXPECT_EQ(b->grad_bytes_read_back, b->grad_bytes_spilled);
  }
  // `strata stats` prints the breakdown for the job that stepped only.
  auto stats = client->StatsText();
  ASSERT_TRUE(stats.ok()) << stats.status();
  std::printf("%s", stats->c_str());
  const size_t stepped = stats->find("  stepped ");
  const size_t idle_at = stats->find("  idle ");
  ASSERT_NE(stepped, std::string::npos) << *stats;
  ASSERT_NE(idle_at, std::string::npos) << *stats;
  // A job's row and its indented lines, up to the next job's row.
  auto row_of = [&](size_t at) {
    size_t end = stats->find('\n', at);
    while (end != std::string::npos && stats->compare(end + 1, 4, "    ") == 0) end = stats->find('\n', end + 1);
    return stats->substr(at, end == std::string::npos ? std::string::npos : end - at);
  };
  EXPECT_NE(row_of(stepped).find("    last step "), std::string::npos) << *stats;
  EXPECT_NE(row_of(stepped).find("waiting for NVMe loads "), std::string::npos) << *stats;
  EXPECT_NE(row_of(stepped).find("; gradients spilled "), std::string::npos) << *stats;
  EXPECT_EQ(row_of(idle_at).find("    last step "), std::string::npos) << *stats;
  session->reset();
  EXPECT_EQ(daemon.Stop(), 0);
}

// A backward that makes gradients faster than the daemon inspects and spills
// them (every slot written and signaled back to back, no Flush): waiting for
// room in the gradient window (RankSession::WaitGradRoom) before each write
// keeps the gradients within the budget, where writing ahead holds nearly
// every gradient at once (24 slots here against a budget of 3). The steps
// still get every gradient right.
TEST(DaemonWindowTest, AFastBackwardWaitsForRoomInsteadOfGrowingTheWindow) {
  constexpr uint32_t kMany = 24;
  DaemonProcess daemon(MakeTestDir("window", "fast-backward"));
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  std::vector<TensorDesc> model;
  for (uint32_t t = 0; t < kMany; ++t) model.push_back({absl::StrCat("layer", t), kNumel});
  ASSERT_TRUE(client->CreateJob(Spec("unbounded", 0)).ok());
  ASSERT_TRUE(client->CreateJob(Spec("fast", kBudget)).ok());
  // Each job's params after its steps, as the next forward reads them.
  auto train = [&](const std::string& name, uint64_t* peak) -> std::vector<std::vector<float>> {
    std::vector<std::vector<float>> seen;
    auto session = client->Attach(name, 0);
    EXPECT_TRUE(session.ok()) << session.status();
    if (!session.ok()) return seen;
    RankSession& rank = **session;
    EXPECT_TRUE(rank.RegisterTensors(model).ok());
    EXPECT_TRUE(rank.doorbell_active());
    for (ShardView& shard : rank.shards()) {
      float* p = reinterpret_cast<float*>(shard.param);
      for (uint64_t e = 0; e < shard.padded_numel; ++e) p[e] = Initial(shard.index, e);
    }
    EXPECT_TRUE(rank.InitParams().ok());
    std::atomic<bool> sampling{true};
    std::atomic<int> phase{0};
    std::atomic<uint64_t> sampled[3] = {0, 0, 0};
    std::thread sampler([&] {
      while (sampling.load()) {
        const int ph = phase.load();
        sampled[ph] = std::max(sampled[ph].load(), Resident(rank));
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    });
    for (int step = 0; step < 2 && !HasFailure(); ++step) {
      phase = 0;
      for (uint32_t i = kMany; i-- > 0;) {
        absl::Status room = rank.WaitGradRoom(i);
        EXPECT_TRUE(room.ok()) << room;
        float* g = reinterpret_cast<float*>(rank.shards()[i].grad);
        for (uint64_t e = 0; e < kNumel; ++e) g[e] = Grad(i, e, step);
        *peak = std::max(*peak, Resident(rank));
        EXPECT_TRUE(rank.GradReady(i, step).ok());
      }
      phase = 1;
      auto result = rank.WaitStep(step);
      EXPECT_TRUE(result.ok()) << result.status();
      phase = 2;
      for (uint32_t i = 0; i < kMany; ++i) {
        EXPECT_TRUE(rank.Acquire({i}).ok());
        const float* p = reinterpret_cast<const float*>(rank.shards()[i].param);
        seen.emplace_back(p, p + kNumel);
        EXPECT_TRUE(rank.Release({i}).ok());
      }
      EXPECT_TRUE(rank.IterationBoundary().ok());
    }
    sampling = false;
    sampler.join();
    std::printf("%s: region resident peaks: backward %lu, step %lu, forward %lu bytes\n", name.c_str(),
                static_cast<unsigned long>(std::max(*peak, sampled[0].load())),
                static_cast<unsigned long>(sampled[1].load()), static_cast<unsigned long>(sampled[2].load()));
    for (auto& p : sampled) *peak = std::max(*peak, p.load());
    return seen;
  };
  uint64_t unbounded_peak = 0, fast_peak = 0;
  const std::vector<std::vector<float>> unbounded = train("unbounded", &unbounded_peak);
  const std::vector<std::vector<float>> fast = train("fast", &fast_peak);
  if (HasFailure()) return;
  std::printf("region resident peaks while gradients came in back to back: no budget %lu, budget %lu: %lu bytes\n",
              static_cast<unsigned long>(unbounded_peak), static_cast<unsigned long>(kBudget),
              static_cast<unsigned long>(fast_peak));
  ASSERT_EQ(fast.size(), unbounded.size());
  for (size_t i = 0; i < fast.size(); ++i) {
    ASSERT_EQ(std::memcmp(fast[i].data(), unbounded[i].data(), kSlotBytes), 0) << "step " << i / kMany << " shard "
                                                                                 << i % kMany;
  }
  EXPECT_GE(unbounded_peak, kMany * kSlotBytes);  // no budget: every gradient stays up
  // Gradients stay within the room (the budget, one rank), and params within
  // the budget less the gradients -- except params a prefetch was already
  // reading when the gradients came (a read in flight is not recalled; it is
  // trimmed once it lands) and the slot of a demand read (the bound of the
  // test above): at worst the budget twice and a slot, against all 24 slots
  // without waiting (the test fails so without the room: 15-23 slots here).
  EXPECT_LE(fast_peak, 2 * kBudget + kSlotBytes);
  EXPECT_EQ(daemon.Stop(), 0);
}

}  // namespace
}  // namespace strata
