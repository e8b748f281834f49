// Issue 11, limits: stratad's thread count does not grow with its jobs. Every
// job's steps run on one bounded worker pool (--job_worker_threads); a thread
// per job made 1000 jobs cost 1013 threads.
#include <unistd.h>

#include <filesystem>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "client/strata_client.h"
#include "gtest/gtest.h"
#include "tests/daemon_fixture.h"

namespace strata {
namespace {

int ThreadsOf(pid_t pid) {
  std::error_code ec;
  std::filesystem::directory_iterator it(absl::StrCat("/proc/", pid, "/task"), ec);
  if (ec) return -1;
  return static_cast<int>(std::distance(it, std::filesystem::directory_iterator()));
}

JobSpec IdleJob(int i) {
  JobSpec spec;
  spec.name = absl::StrCat("idle", i);
  spec.world_size = 1;
  spec.mode = JobMode::kOffload;
  spec.deepspeed_config_json = R"({"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW"}})";
  return spec;
}

TEST(DaemonThreadsTest, TwoHundredJobsKeepTheThreadCountBounded) {
  CleanDaemon daemon(MakeTestDir("threads", "idle"));
  ASSERT_TRUE(daemon.Start({"--max_jobs_per_uid", "256"}));
  auto client = daemon.Connect();
  ASSERT_NE(client, nullptr);
  // One job first, so the gRPC server's threads for this client exist.
  ASSERT_TRUE(client->CreateJob(IdleJob(0)).ok());
  const int before = ThreadsOf(daemon.pid());
  ASSERT_GT(before, 0);
  for (int i = 1; i < 200; ++i) {
    auto id = client->CreateJob(IdleJob(i));
    ASSERT_TRUE(id.ok()) << "job " << i << ": " << id.status();
  }
  const int after = ThreadsOf(daemon.pid());
  // The RPC server may add a thread or two of its own; a thread per job
  // would add 199.
  EXPECT_LE(after, before + 4) << "stratad had " << before << " threads with 1 job and " << after
                               << " with 200; see " << daemon.log();
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(client->DeleteJob(absl::StrCat("idle", i)).ok());
  EXPECT_LE(ThreadsOf(daemon.pid()), before + 4);
  EXPECT_EQ(daemon.Stop(), 0);
}

}  // namespace
}  // namespace strata
