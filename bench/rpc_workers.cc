#include "bench/rpc_workers.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/daemon_launcher.h"
#include "bench/sample_stats.h"
#include "client/strata_client.h"

namespace strata {
namespace {

constexpr int kWarmupCalls = 200;

struct Worker {
  pid_t pid = -1;
  int go_fd = -1;       // parent writes; closing it starts the worker
  FILE* out = nullptr;  // worker's stdout
};

// One line from the worker, without the newline; "" at EOF.
std::string ReadLine(FILE* f) {
  char buf[512];
  if (std::fgets(buf, sizeof(buf), f) == nullptr) return "";
  return std::string(absl::StripTrailingAsciiWhitespace(buf));
}

void Reap(std::vector<Worker>& workers, bool kill_them) {
  for (Worker& w : workers) {
    if (w.go_fd >= 0) close(w.go_fd);
    w.go_fd = -1;
    if (w.pid > 0) {
      if (kill_them) kill(w.pid, SIGKILL);
      int status;
      waitpid(w.pid, &status, 0);
      w.pid = -1;
    }
    if (w.out != nullptr) std::fclose(w.out);
    w.out = nullptr;
  }
}

}  // namespace

absl::StatusOr<ConcurrentCallsResult> RunConcurrentNoopClients(const std::string& socket, int clients,
                                                               uint64_t calls_per_client) {
  absl::StatusOr<std::string> exe = ThisBinary();
  if (!exe.ok()) return exe.status();
  std::vector<std::string> args = {*exe, "rpc", "--worker_calls", absl::StrCat(calls_per_client),
                                   "--socket", socket};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<Worker> workers(clients);
  for (Worker& w : workers) {
    int go[2], out[2];
    if (pipe2(go, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) {
      Reap(workers, true);
      return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
    }
    const pid_t pid = fork();
    if (pid == 0) {
      // Only async-signal-safe calls until exec: this process runs gRPC threads.
      dup2(go[0], STDIN_FILENO);
      dup2(out[1], STDOUT_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(go[0]);
    close(out[1]);
    if (pid < 0) {
      close(go[1]);
      close(out[0]);
      Reap(workers, true);
      return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
    }
    w.pid = pid;
    w.go_fd = go[1];
    w.out = fdopen(out[0], "r");
  }
  for (Worker& w : workers) {
    const std::string line = ReadLine(w.out);
    if (line != "ready") {
      Reap(workers, true);
      return absl::UnavailableError(absl::StrCat("a client process did not start: '", line, "'"));
    }
  }
  // Start them all at once: each worker is blocked reading its stdin.
  for (Worker& w : workers) {
    close(w.go_fd);
    w.go_fd = -1;
  }
  ConcurrentCallsResult result;
  int64_t first_start = INT64_MAX, last_end = 0;
  absl::Status error;
  for (Worker& w : workers) {
    const std::string line = ReadLine(w.out);
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    int64_t start = 0, end = 0;
    uint64_t failed = 0;
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &start) || !absl::SimpleAtoi(parts[1], &end) ||
        !absl::SimpleAtoi(parts[2], &failed)) {
      if (error.ok()) error = absl::UnavailableError(absl::StrCat("a client process failed: '", line, "'"));
      continue;
    }
    first_start = std::min(first_start, start);
    last_end = std::max(last_end, end);
    result.calls += calls_per_client;
    result.failed += failed;
  }
  Reap(workers, false);
  if (!error.ok()) return error;
  result.seconds = static_cast<double>(last_end - first_start) / 1e9;
  result.calls_per_s = result.seconds > 0 ? static_cast<double>(result.calls) / result.seconds : 0;
  return result;
}

int RunNoopWorker(const std::string& socket, uint64_t calls) {
  ClientOptions options;
  options.socket_path = socket;
  absl::StatusOr<std::unique_ptr<StrataClient>> client = StrataClient::Connect(options);
  if (!client.ok()) {
    std::printf("error connecting: %s\n", std::string(client.status().message()).c_str());
    return 1;
  }
  for (int i = 0; i < kWarmupCalls; ++i) {
    if (absl::Status s = (*client)->Noop(); !s.ok()) {
      std::printf("error in warm-up: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  std::printf("ready\n");
  std::fflush(stdout);
  char byte;
  while (read(STDIN_FILENO, &byte, 1) > 0) {
  }
  uint64_t failed = 0;
  const int64_t start = MonotonicNanos();
  for (uint64_t i = 0; i < calls; ++i) failed += (*client)->Noop().ok() ? 0 : 1;
  const int64_t end = MonotonicNanos();
  std::printf("%lld %lld %llu\n", static_cast<long long>(start), static_cast<long long>(end),
              static_cast<unsigned long long>(failed));
  std::fflush(stdout);
  return 0;
}

}  // namespace strata
