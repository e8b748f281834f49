// A real stratad for integration tests: started from build/bin with a socket
// and NVMe directory of its own, stopped with SIGTERM.
#ifndef STRATA_TESTS_DAEMON_FIXTURE_H_
#define STRATA_TESTS_DAEMON_FIXTURE_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/strata_client.h"
#include "gtest/gtest.h"

namespace strata {

// The build directory: $STRATA_BINARY_DIR when set, else the parent of the
// directory this test binary lives in (build/tests/x -> build).
inline std::string BuildDir() {
  if (const char* env = std::getenv("STRATA_BINARY_DIR"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "build";
  return exe.parent_path().parent_path().string();
}

class DaemonProcess {
 public:
  // `dir` holds the socket, the NVMe files and the log.
  explicit DaemonProcess(std::string dir) : dir_(std::move(dir)) {}
  ~DaemonProcess() { Stop(); }

  std::string socket() const { return dir_ + "/s.sock"; }
  std::string log() const { return dir_ + "/stratad.log"; }
  std::string nvme() const { return dir_ + "/nvme"; }
  pid_t pid() const { return pid_; }

  // Starts stratad and waits until it answers.
  ::testing::AssertionResult Start(std::vector<std::string> extra = {}) {
    std::filesystem::create_directories(nvme());
    std::string stratad = BuildDir() + "/bin/stratad";
    std::vector<std::string> args = {stratad, "--socket", socket(), "--nvme_path", nvme(),
                                      "--nvme_capacity", "256MiB", "--pinned_capacity", "64MiB",
                                      "--device", "emulated", "--optimizer_threads", "2"};
    for (auto& e : extra) args.push_back(e);
    pid_ = fork();
    if (pid_ == 0) {
      FILE* out = freopen(log().c_str(), "a", stderr);
      (void)out;
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    for (int i = 0; i < 200; ++i) {
      ClientOptions o;
      o.socket_path = socket();
      o.rpc_timeout = absl::Seconds(2);
      if (StrataClient::Connect(o).ok()) return ::testing::AssertionSuccess();
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return ::testing::AssertionFailure() << "stratad exited at startup; see " << log();
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return ::testing::AssertionFailure() << "stratad did not answer; see " << log();
  }

  // SIGTERM, and the exit status (0 = clean).
  int Stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // kill -9: no shutdown path runs (a crash).
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  bool running() {
    if (pid_ <= 0) return false;
    int status;
    return waitpid(pid_, &status, WNOHANG) == 0;
  }

  std::unique_ptr<StrataClient> Connect() {
    ClientOptions o;
    o.socket_path = socket();
    o.rpc_timeout = absl::Seconds(10);
    o.step_timeout = absl::Seconds(30);
    auto c = StrataClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::move(*c) : nullptr;
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
};

// Removes the directories handed out by MakeTestDir when the test that made
// them ends: all of it when the test passed; on a failure only the NVMe files
// (hundreds of MiB per daemon start), so the logs stay for the reader. Without
// this every run left ~0.3-0.6 GiB per daemon test under build/ and filled CI's
// disk.
class TestDirSweeper : public ::testing::EmptyTestEventListener {
 public:
  void Add(std::string dir) { dirs_.push_back(std::move(dir)); }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const bool passed = info.result() == nullptr || !info.result()->Failed();
    for (const std::string& dir : dirs_) {
      std::error_code ec;
      if (passed) {
        std::filesystem::remove_all(dir, ec);
      } else {
        std::filesystem::remove_all(dir + "/nvme", ec);
      }
    }
    dirs_.clear();
  }

  // The sweeper of this test binary, installed into gtest's listeners on
  // first use (gtest owns it from then on).
  static TestDirSweeper& Get() {
    static TestDirSweeper* sweeper = [] {
      auto* s = new TestDirSweeper;
      ::testing::UnitTest::GetInstance()->listeners().Append(s);
      return s;
    }();
    return *sweeper;
  }

 private:
  std::vector<std::string> dirs_;
};

// A fresh directory build/<prefix>-<name>-<pid> for one test's daemons,
// removed when the test ends (see TestDirSweeper).
inline std::string MakeTestDir(const std::string& prefix, const std::string& name) {
  std::string dir = absl::StrCat(BuildDir(), "/", prefix, "-", name, "-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  TestDirSweeper::Get().Add(dir);
  return dir;
}

// A daemon whose NVMe files (256 MiB per start) are removed when the test
// ends, pass or fail; its log stays.
class CleanDaemon : public DaemonProcess {
 public:
  explicit CleanDaemon(const std::string& dir) : DaemonProcess(dir) {}
  ~CleanDaemon() {
    Stop();
    std::error_code ec;
    std::filesystem::remove_all(nvme(), ec);
  }
};

}  // namespace strata

#endif  // STRATA_TESTS_DAEMON_FIXTURE_H_
