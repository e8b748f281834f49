#include "bench/daemon_launcher.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/strata_client.h"
#include "core/byte_size.h"

namespace strata {
namespace {

bool IsTmpfs(const std::string& path) {
  struct statfs fs;
  return statfs(path.c_str(), &fs) == 0 && fs.f_type == TMPFS_MAGIC;
}

}  // namespace

absl::StatusOr<std::string> ThisBinary() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return absl::InternalError(absl::StrCat("reading /proc/self/exe: ", ec.message()));
  return exe.string();
}

absl::StatusOr<std::string> ThisBinaryDir() {
  absl::StatusOr<std::string> exe = ThisBinary();
  if (!exe.ok()) return exe.status();
  return std::filesystem::path(*exe).parent_path().string();
}

absl::Status WithDaemonLogTail(absl::Status status, const BenchDaemon* daemon) {
  if (status.ok() || daemon == nullptr) return status;
  return absl::Status(status.code(), absl::StrCat(status.message(), "\nthe daemon's log ", daemon->log_path(),
                                                  " ends:", TailOfFile(daemon->log_path(), 20)));
}

absl::Status WriteBenchJson(const std::string& path, const std::string& json_text) {
  std::ofstream out(path);
  out << json_text << "\n";
  if (!out) return absl::UnavailableError(absl::StrCat("writing ", path, " failed"));
  std::printf("\nwrote %s\n", path.c_str());
  return absl::OkStatus();
}

std::string TailOfFile(const std::string& path, int lines) {
  std::ifstream in(path);
  std::deque<std::string> tail;
  for (std::string line; std::getline(in, line);) {
    tail.push_back(line);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  std::string out;
  for (const std::string& l : tail) absl::StrAppend(&out, "\n  ", l);
  return out;
}

absl::StatusOr<BenchScratchDir> BenchScratchDir::Create(const std::string& parent) {
  std::string base = parent;
  if (base.empty()) {
    const char* tmpdir = std::getenv("TMPDIR");
    base = tmpdir != nullptr && *tmpdir != '\0' && !IsTmpfs(tmpdir) ? tmpdir : "/var/tmp";
  }
  std::error_code ec;
  std::filesystem::create_directories(base, ec);
  if (IsTmpfs(base)) {
    return absl::FailedPreconditionError(absl::StrCat(
        base, " is tmpfs: NVMe numbers taken there would be memory numbers (and O_DIRECT is refused); "
              "pass --nvme_path DIR on a disk"));
  }
  std::string pattern = absl::StrCat(base, "/strata-bench-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("creating a scratch directory ", pattern, ": ", std::strerror(errno)));
  }
  return BenchScratchDir(pattern);
}

BenchScratchDir::BenchScratchDir(BenchScratchDir&& other) noexcept : path_(std::move(other.path_)) {
  other.path_.clear();
}

BenchScratchDir& BenchScratchDir::operator=(BenchScratchDir&& other) noexcept {
  if (this != &other) {
    BenchScratchDir old(std::move(*this));
    path_ = std::move(other.path_);
    other.path_.clear();
  }
  return *this;
}

BenchScratchDir::~BenchScratchDir() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

absl::StatusOr<uint64_t> BenchScratchDir::FreeBytes() const {
  struct statfs fs;
  if (statfs(path_.c_str(), &fs) != 0) {
    return absl::InternalError(absl::StrCat("statfs of ", path_, ": ", std::strerror(errno)));
  }
  return static_cast<uint64_t>(fs.f_bavail) * fs.f_bsize;
}

absl::StatusOr<std::unique_ptr<BenchDaemon>> BenchDaemon::Start(const BenchDaemonOptions& options) {
  absl::StatusOr<std::string> dir = ThisBinaryDir();
  if (!dir.ok()) return dir.status();
  const std::string binary = *dir + "/stratad";
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("no stratad beside this binary (", binary,
                                            "): build it (ninja stratad) or pass --socket of a running daemon"));
  }
  // Started through a symlink of another name: the process is then
  // "strata-bench-daemon" (comm and command line), so a `pkill stratad`
  // meant for someone's own daemons -- seen on shared machines, stopping a
  // benchmark midway -- leaves it alone. /proc/PID/exe still names stratad.
  const std::string alias = options.work_dir + "/strata-bench-daemon";
  std::error_code ec;
  std::filesystem::remove(alias, ec);
  std::filesystem::create_symlink(binary, alias, ec);
  if (ec) return absl::InternalError(absl::StrCat("linking ", alias, " to ", binary, ": ", ec.message()));
  const std::string socket_path = options.work_dir + "/bench.sock";
  const std::string log_path = options.work_dir + "/bench-daemon.log";
  std::vector<std::string> args = {alias, "--socket", socket_path, "--device", "emulated"};
  if (!options.nvme_path.empty()) {
    args.insert(args.end(), {"--nvme_path", options.nvme_path, "--nvme_capacity",
                             absl::StrCat(options.nvme_capacity_bytes)});
  }
  if (options.optimizer_threads > 0) {
    args.insert(args.end(), {"--optimizer_threads", absl::StrCat(options.optimizer_threads)});
  }
  if (!options.fsync_policy.empty()) args.insert(args.end(), {"--fsync_policy", options.fsync_policy});
  // stratad enforces --pinned_capacity (default 1GiB) across jobs; a bench
  // daemon may pin up to half the host's memory (extra_args may override).
  args.insert(args.end(), {"--pinned_capacity", absl::StrCat(static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                                                              static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) / 2)});
  args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());

  // Everything the child needs is prepared before fork: between fork and exec
  // only async-signal-safe calls are allowed (this process runs gRPC threads).
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("creating ", log_path, ": ", std::strerror(errno)));
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    // No PR_SET_PDEATHSIG: it fired spuriously here (a SIGTERM to the daemon
    // while the benchmark's main thread, which forked it, was still running),
    // so a benchmark killed by SIGKILL leaves the daemon running; the stop
    // path and every error path stop it.
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log_fd);
  std::unique_ptr<BenchDaemon> daemon(new BenchDaemon(pid, binary, socket_path, log_path));
  const absl::Time deadline = absl::Now() + absl::Minutes(1);
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      daemon->pid_ = -1;
      return absl::UnavailableError(absl::StrCat("stratad exited at startup (status ", status, "); its log ",
                                                 log_path, " ends:", TailOfFile(log_path, 15)));
    }
    if (access(socket_path.c_str(), F_OK) == 0) {
      ClientOptions o;
      o.socket_path = socket_path;
      o.rpc_timeout = absl::Seconds(2);
      absl::StatusOr<std::unique_ptr<StrataClient>> c = StrataClient::Connect(o);
      if (c.ok() && (*c)->Noop().ok()) return daemon;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::UnavailableError(absl::StrCat("stratad did not answer within a minute; its log ", log_path,
                                             " ends:", TailOfFile(log_path, 15)));
}

BenchDaemon::~BenchDaemon() { (void)Stop(); }

absl::Status BenchDaemon::Stop() {
  if (pid_ <= 0) return absl::OkStatus();
  kill(pid_, SIGTERM);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "stratad did not stop cleanly (", WIFEXITED(status) ? "exit " : "signal ",
      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), "); see ", log_path_));
}

}  // namespace strata
