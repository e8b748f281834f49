// stratad's durability across restarts and kill -9 (issue 11 items 4-6 and
// the NVMe path lock): deleted and expired jobs stay deleted, a job name used
// twice does not stop the next start, NVMe use does not grow run after run, a
// restored Infinity job checkpoints its real params, and a second daemon on
// the same NVMe path is refused.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "tests/daemon_fixture.h"
#include "tests/infinity_job.h"

namespace strata {
namespace {

// A fresh directory for one test, removed when the test passed (each holds
// a preallocated NVMe data file); kept for a look when it failed.
class ScopedDir {
 public:
  explicit ScopedDir(const std::string& name)
      : path_(absl::StrCat(BuildDir(), "/durability-", name, "-", getpid())) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScopedDir() {
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(path_);
  }
  operator const std::string&() const { return path_; }
  std::string operator+(const std::string& tail) const { return path_ + tail; }

 private:
  std::string path_;
};

std::vector<TensorDesc> Model() { return {{"w1", 5000}, {"b1", 37}, {"w2", 12000}}; }
float InitialParam(uint32_t t, uint64_t e) { return std::sin(0.001f * (e + 1) + t); }
float Grad(uint32_t t, uint64_t e, uint64_t step) { return std::cos(0.01f * e + t + 0.5f * step) * 0.1f; }


// Creates (when `create`) and runs `steps` steps of a two-rank Infinity job
// from `first_step`; the sessions end when this returns.
void RunJob(StrataClient& client, const std::string& name, int steps, int first_step, bool create) {
  if (create) {
    ASSERT_TRUE(client.CreateJob(SmallInfinitySpec(name)).ok());
  }
  std::vector<std::unique_ptr<RankSession>> ranks;
  for (uint32_t r = 0; r < 2; ++r) {
    auto s = client.Attach(name, r);
    ASSERT_TRUE(s.ok()) << s.status();
    ranks.push_back(std::move(*s));
    ASSERT_TRUE(ranks[r]->RegisterTensors(Model()).ok());
    if (first_step == 0) {
      for (ShardView& shard : ranks[r]->shards()) FillOwned(shard, shard.param, InitialParam);
    }
  }
  if (first_step == 0) {
    absl::Status init[2];
    std::thread other([&] { init[1] = ranks[1]->InitParams(); });
    init[0] = ranks[0]->InitParams();
    other.join();
    ASSERT_TRUE(init[0].ok()) << init[0];
    ASSERT_TRUE(init[1].ok()) << init[1];
  }
  for (int step = first_step; step < first_step + steps; ++step) {
    for (uint32_t r = 0; r < 2; ++r) {
      for (ShardView& shard : ranks[r]->shards()) {
        FillOwned(shard, shard.grad, [&](uint32_t t, uint64_t e) { return Grad(t, e, step); });
        ASSERT_TRUE(ranks[r]->GradReady(shard.index, step).ok());
      }
    }
    for (uint32_t r = 0; r < 2; ++r) ASSERT_TRUE(ranks[r]->WaitStep(step).ok());
  }
}

std::vector<std::string> JobNames(StrataClient& client) {
  std::vector<std::string> names;
  auto jobs = client.ListJobs();
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  if (jobs.ok()) {
    for (const JobSummary& j : *jobs) names.push_back(j.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

uint64_t NvmeUsedBytes(StrataClient& client) {
  auto text = client.StatsText();
  EXPECT_TRUE(text.ok());
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    uint64_t used = 0;
    if (words.size() >= 3 && words[0] == "nvme" && words[1] == "used" && absl::SimpleAtoi(words[2], &used)) {
      return used;
    }
  }
  ADD_FAILURE() << "no nvme line in " << *text;
  return 0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(DaemonDurabilityTest, DeletedAndExpiredJobsStayDeletedAfterKill9) {
  const ScopedDir dir("deleted");
  {
    std::ofstream(dir + "/stratad.conf") << "reattach_timeout_s: 1\n";
  }
  DaemonProcess daemon(dir);
  ASSERT_TRUE(daemon.Start({"--config", dir + "/stratad.conf"}));
  auto client = daemon.Connect();
  RunJob(*client, "deleted", 2, 0, true);
  ASSERT_TRUE(client->DeleteJob("deleted").ok());
  RunJob(*client, "expired", 1, 0, true);  // its sessions end here; it expires a second later
  for (int i = 0; i < 100 && !JobNames(*client).empty(); ++i) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(JobNames(*client).empty()) << "the job did not expire";
  RunJob(*client, "kept", 1, 0, true);
  client.reset();
  daemon.Kill();
  ASSERT_TRUE(daemon.Start());
  client = daemon.Connect();
  // The abandoned "kept" job may expire again later; right after the start it is there.
  EXPECT_EQ(JobNames(*client), std::vector<std::string>{"kept"});
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonDurabilityTest, TheSameJobNameTwiceDoesNotStopTheNextStart) {
  const ScopedDir dir("samename");
  DaemonProcess daemon(dir);
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  RunJob(*client, "again", 1, 0, true);
  ASSERT_TRUE(client->DeleteJob("again").ok());
  RunJob(*client, "again", 3, 0, true);
  client.reset();
  daemon.Kill();
  ASSERT_TRUE(daemon.Start()) << ReadFile(daemon.log());
  client = daemon.Connect();
  auto jobs = client->ListJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].name, "again");
  EXPECT_EQ((*jobs)[0].step, 3u);
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonDurabilityTest, NvmeUseStaysConstantOverRunsAndDeletes) {
  const ScopedDir dir("usage");
  DaemonProcess daemon(dir);
  ASSERT_TRUE(daemon.Start());
  auto client = daemon.Connect();
  const uint64_t empty = NvmeUsedBytes(*client);
  for (int run = 0; run < 6; ++run) {
    RunJob(*client, "run", 2, 0, true);
    EXPECT_GT(NvmeUsedBytes(*client), empty);
    ASSERT_TRUE(client->DeleteJob("run").ok());
    EXPECT_EQ(NvmeUsedBytes(*client), empty) << "run " << run;
  }
  client.reset();
  daemon.Kill();
  ASSERT_TRUE(daemon.Start());
  client = daemon.Connect();
  EXPECT_EQ(NvmeUsedBytes(*client), empty);
  EXPECT_TRUE(JobNames(*client).empty());
  EXPECT_EQ(daemon.Stop(), 0);
}

// Issue 11 item 6: a restored Infinity job's checkpoint had all-zero params.
TEST(DaemonDurabilityTest, ARestoredInfinityJobCheckpointsItsRealParams) {
  const ScopedDir dir("restoredckpt");
  DaemonProcess daemon(dir);
  ASSERT_TRUE(daemon.Start({"--checkpoint_root", dir}));
  auto client = daemon.Connect();
  RunJob(*client, "inf", 2, 0, true);
  ASSERT_TRUE(client->SaveCheckpoint("inf", dir + "/before").ok());
  client.reset();
  daemon.Kill();
  ASSERT_TRUE(daemon.Start({"--checkpoint_root", dir}));
  client = daemon.Connect();
  ASSERT_TRUE(client->SaveCheckpoint("inf", dir + "/after").ok());
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/before")) {
    const std::string name = entry.path().filename();
    const std::string a = ReadFile(entry.path()), b = ReadFile(dir + "/after/" + name);
    EXPECT_FALSE(a.empty());
    EXPECT_EQ(a == b, true) << name << " differs between the checkpoint before and after the restart";
    ++files;
  }
  EXPECT_EQ(files, 7);  // manifest + 2 ranks x 3 shards
  // Loading it makes those params the new job's home: two more steps of the
  // loaded job equal what the original job computes for steps 2 and 3.
  auto loaded = client->LoadCheckpoint(dir + "/after", "copy");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  RunJob(*client, "copy", 2, 2, false);
  RunJob(*client, "inf", 2, 2, false);
  ASSERT_TRUE(client->SaveCheckpoint("copy", dir + "/copy4").ok());
  ASSERT_TRUE(client->SaveCheckpoint("inf", dir + "/inf4").ok());
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/inf4")) {
    const std::string name = entry.path().filename();
    if (name == "manifest.json") continue;
    EXPECT_EQ(ReadFile(entry.path()) == ReadFile(dir + "/copy4/" + name), true) << name;
  }
  EXPECT_EQ(daemon.Stop(), 0);
}

TEST(DaemonDurabilityTest, ASecondDaemonOnTheSameNvmePathIsRefused) {
  const ScopedDir dir("twice");
  DaemonProcess first(dir);
  ASSERT_TRUE(first.Start());
  const ScopedDir other_dir("twice-other");
    const std::string log = other_dir + "/stratad.log";
  pid_t pid = fork();
  if (pid == 0) {
    FILE* out = freopen(log.c_str(), "w", stderr);
    (void)out;
    const std::string stratad = BuildDir() + "/bin/stratad";
    const std::string sock = other_dir + "/s.sock";
    const std::string nvme = first.nvme();
    execl(stratad.c_str(), stratad.c_str(), "--socket", sock.c_str(), "--nvme_path", nvme.c_str(),
          "--nvme_capacity", "256MiB", "--device", "emulated", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 300 && !exited; ++i) {
    exited = waitpid(pid, &status, WNOHANG) == pid;
    if (!exited) absl::SleepFor(absl::Milliseconds(100));
  }
  if (!exited) {  // it started: the path was not locked
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "a second stratad on the same --nvme_path started";
  }
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 0);
  const std::string text = ReadFile(log);
  EXPECT_NE(text.find(absl::StrCat("pid ", first.pid())), std::string::npos) << text;
  EXPECT_TRUE(first.running());
  auto client = first.Connect();
  EXPECT_TRUE(client->Noop().ok());
  EXPECT_EQ(first.Stop(), 0);
}

}  // namespace
}  // namespace strata
