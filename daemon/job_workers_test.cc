// Jobs on the daemon's shared worker pool (issue 11, limits): a job's items
// run in order, one per turn; jobs with work take turns, so one job with a
// long queue holds up another by at most one item; however many jobs exist,
// the process has only the pool's threads; Stop finishes queued work.
#include <deque>
#include <filesystem>
#include <functional>
#include <iterator>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "daemon/job.h"
#include "daemon/job_proto.h"
#include "daemon/job_settings.h"
#include "gtest/gtest.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "tiers/transfer_executor.h"

namespace strata {
namespace {

// A pool the test turns by hand: Schedule queues, RunOne runs the oldest.
class ManualExecutor final : public TransferExecutor {
 public:
  void Schedule(std::function<void()> work) override {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(work));
  }
  size_t pending() const {
    absl::MutexLock lock(&mu_);
    return queue_.size();
  }
  bool RunOne() {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      if (queue_.empty()) return false;
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
    return true;
  }

 private:
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
};

// ZeRO-Offload, one rank, fp32, no loss scaling: each gradient is an item.
JobSettings Settings(const std::string& name, uint64_t sub_group_size) {
  strata::v1::CreateJobRequest r;
  r.set_name(name);
  r.set_world_size(1);
  r.set_mode(strata::v1::MODE_OFFLOAD);
  r.set_deepspeed_config_json(absl::StrCat(R"({"zero_optimization": {"stage": 2, "sub_group_size": )",
                                           sub_group_size, R"(}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})"));
  auto s = ResolveJobSettings(r);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

int ThreadsOfThisProcess() {
  return static_cast<int>(std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                                        std::filesystem::directory_iterator()));
}

class JobWorkersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto opt = CpuOptimizer::Create({});
    ASSERT_TRUE(opt.ok()) << opt.status();
    optimizer_ = std::move(*opt);
  }

  // A registered, initialized job of `numel` elements cut into sub-groups.
  std::unique_ptr<Job> MakeJob(uint64_t id, uint64_t numel, uint64_t sub_group_size, TransferExecutor* workers) {
    JobServices services;
    services.optimizer = optimizer_.get();
    services.workers = workers;
    auto job = Job::Create(id, Settings(absl::StrCat("job", id), sub_group_size), services);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return nullptr;
    EXPECT_TRUE((*job)->Register(0, {TensorSpec{TensorId(0), "w", numel}}).ok());
    EXPECT_TRUE((*job)->InitParams(0).ok());
    return std::move(*job);
  }

  // Sends every gradient of step `step` (zeros: the slots start zeroed).
  static void SendAllGrads(Job& job, uint64_t step) {
    const uint32_t n = static_cast<uint32_t>(job.SlotsOf(0).size());
    for (uint32_t i = 0; i < n; ++i) ASSERT_TRUE(job.GradReady(0, i, step).ok());
  }

  std::unique_ptr<CpuOptimizer> optimizer_;
};

TEST_F(JobWorkersTest, JobsTakeTurnsOneItemEach) {
  ManualExecutor pool;
  auto busy = MakeJob(1, 16384, 4096, &pool);  // 4 sub-groups: 4 checks + the step = 5 items
  auto quick = MakeJob(2, 1000, 1 << 20, &pool);  // 1 check + the step = 2 items
  ASSERT_NE(busy, nullptr);
  ASSERT_NE(quick, nullptr);
  ASSERT_EQ(busy->SlotsOf(0).size(), 4u);
  ASSERT_EQ(quick->SlotsOf(0).size(), 1u);

  SendAllGrads(*busy, 0);
  // However many items a job has queued, it holds one place in the pool.
  EXPECT_EQ(pool.pending(), 1u);
  SendAllGrads(*quick, 0);
  EXPECT_EQ(pool.pending(), 2u);

  // Turns alternate: busy, quick, busy, quick -> the quick job's step is done
  // after 4 turns although 5 of the busy job's items were queued before it.
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(pool.RunOne());
    EXPECT_LE(pool.pending(), 2u);
  }
  EXPECT_EQ(quick->next_step(), 1u);
  EXPECT_EQ(busy->next_step(), 0u);

  int turns = 4;
  while (pool.RunOne()) ++turns;
  EXPECT_EQ(turns, 7);  // every item ran once
  EXPECT_EQ(busy->next_step(), 1u);
  // In order: the busy job's step ran after its four checks, not before.
  auto outcome = busy->WaitStep(0, absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_FALSE(outcome->skipped);
  EXPECT_EQ(busy->counters().steps_applied, 1u);
  EXPECT_EQ(quick->counters().steps_applied, 1u);
}

TEST_F(JobWorkersTest, ManyJobsAddNoThreads) {
  auto pool = ThreadPoolExecutor::Create(2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  const int before = ThreadsOfThisProcess();
  std::vector<std::unique_ptr<Job>> jobs;
  for (uint64_t id = 1; id <= 200; ++id) {
    jobs.push_back(MakeJob(id, 256, 1 << 20, pool->get()));
    ASSERT_NE(jobs.back(), nullptr);
  }
  EXPECT_EQ(ThreadsOfThisProcess(), before) << "200 jobs must share the pool's 2 threads";
  // And they all step, on those 2 threads.
  for (auto& job : jobs) SendAllGrads(*job, 0);
  for (auto& job : jobs) {
    auto outcome = job->WaitStep(0, absl::Now() + absl::Seconds(30));
    ASSERT_TRUE(outcome.ok()) << outcome.status();
  }
  EXPECT_EQ(ThreadsOfThisProcess(), before);
  jobs.clear();
}

TEST_F(JobWorkersTest, StopFinishesQueuedWorkThenRunsNoMore) {
  auto pool = ThreadPoolExecutor::Create(1);
  ASSERT_TRUE(pool.ok());
  auto job = MakeJob(1, 4096, 1024, pool->get());
  ASSERT_NE(job, nullptr);
  SendAllGrads(*job, 0);
  job->Stop();  // waits for the queued checks and the step
  EXPECT_EQ(job->next_step(), 1u);
  EXPECT_EQ(job->counters().steps_applied, 1u);
  // Gradients after Stop are queued but never run: no turn is scheduled.
  SendAllGrads(*job, 1);
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(job->next_step(), 1u);
  job.reset();
}

TEST_F(JobWorkersTest, AJobWithoutAPoolMakesItsOwn) {
  auto job = MakeJob(1, 1000, 1 << 20, nullptr);
  ASSERT_NE(job, nullptr);
  SendAllGrads(*job, 0);
  auto outcome = job->WaitStep(0, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(outcome.ok()) << outcome.status();
}

}  // namespace
}  // namespace strata
