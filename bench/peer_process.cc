#include "bench/peer_process.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/errno_status.h"

extern char** environ;

namespace strata {
namespace {

bool Executable(const std::string& path) { return !path.empty() && access(path.c_str(), X_OK) == 0; }

std::string ReadAll(int fd) {
  std::string out;
  char buf[65536];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Our environment with `extra` layered on top (same name: extra wins).
std::vector<std::string> MergedEnvironment(const std::vector<std::string>& extra) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view kv(*e);
    env[std::string(kv.substr(0, kv.find('=')))] = std::string(kv);
  }
  for (const std::string& kv : extra) env[kv.substr(0, kv.find('='))] = kv;
  std::vector<std::string> out;
  for (auto& [name, kv] : env) out.push_back(kv);
  return out;
}

std::vector<char*> CStrings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

absl::StatusOr<int> TempFile() {
  char path[] = "/tmp/strata-bench-peer-XXXXXX";
  int fd = mkostemp(path, O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "temporary file for a peer's stderr");
  unlink(path);  // kept open; gone when closed
  return fd;
}

std::string Tail(int fd) {
  lseek(fd, 0, SEEK_SET);
  std::string err = ReadAll(fd);
  return err.size() > 3000 ? err.substr(err.size() - 3000) : err;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerCoprocess>> PeerCoprocess::Start(const PeerCommand& cmd) {
  if (cmd.argv.empty()) return absl::InvalidArgumentError("peer command is empty");
  std::vector<std::string> env = MergedEnvironment(cmd.env);
  std::vector<std::string> argv = cmd.argv;
  std::vector<char*> cenv = CStrings(env), cargv = CStrings(argv);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    return ErrnoToStatus(errno, "socketpair for a peer");
  }
  absl::StatusOr<int> err_fd = TempFile();
  if (!err_fd.ok()) {
    close(sv[0]);
    close(sv[1]);
    return err_fd.status();
  }
  std::unique_ptr<PeerCoprocess> p(new PeerCoprocess());
  p->sock_ = sv[0];
  p->err_fd_ = *err_fd;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sv[1], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, sv[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, *err_fd, STDERR_FILENO);
  int rc = posix_spawnp(&p->pid_, cargv[0], &actions, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  close(sv[1]);
  if (rc != 0) {
    p->pid_ = -1;
    return ErrnoToStatus(rc, absl::StrCat("starting ", cmd.argv[0]));
  }
  return p;
}

PeerCoprocess::~PeerCoprocess() {
  if (sock_ >= 0) {
    shutdown(sock_, SHUT_WR);  // EOF on its stdin: it finishes
    close(sock_);
  }
  if (pid_ > 0) {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (err_fd_ >= 0) close(err_fd_);
}

std::string PeerCoprocess::StderrTail() const { return Tail(err_fd_); }

absl::StatusOr<nlohmann::json> PeerCoprocess::Next() {
  while (true) {
    size_t nl = pending_.find('\n');
    if (nl != std::string::npos) {
      std::string line(absl::StripAsciiWhitespace(absl::string_view(pending_).substr(0, nl)));
      pending_.erase(0, nl + 1);
      if (line.empty() || line.front() != '{') continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object()) return j;
      continue;
    }
    char buf[4096];
    ssize_t n = recv(sock_, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string tail(absl::StripAsciiWhitespace(StderrTail()));
      if (tail.size() > 600) tail = "..." + tail.substr(tail.size() - 600);
      return absl::UnavailableError(absl::StrCat("the peer exited", tail.empty() ? "" : ": ", tail));
    }
    pending_.append(buf, static_cast<size_t>(n));
  }
}

absl::StatusOr<nlohmann::json> PeerCoprocess::Request(const std::string& line) {
  const std::string msg = line + "\n";
  size_t sent = 0;
  while (sent < msg.size()) {
    ssize_t n = send(sock_, msg.data() + sent, msg.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "sending a request to the peer");
    sent += static_cast<size_t>(n);
  }
  return Next();
}

absl::StatusOr<PeerOutput> RunPeerProcess(const PeerCommand& cmd) {
  if (cmd.argv.empty()) return absl::InvalidArgumentError("peer command is empty");
  std::vector<std::string> env = MergedEnvironment(cmd.env);
  std::vector<std::string> argv = cmd.argv;
  std::vector<char*> cenv = CStrings(env), cargv = CStrings(argv);
  int out_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe for a peer's stdout");
  absl::StatusOr<int> err_or = TempFile();
  if (!err_or.ok()) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return err_or.status();
  }
  const int err_fd = *err_or;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_fd, STDERR_FILENO);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, cargv[0], &actions, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out_pipe[1]);
  if (rc != 0) {
    close(out_pipe[0]);
    close(err_fd);
    return ErrnoToStatus(rc, absl::StrCat("starting ", cmd.argv[0]));
  }
  PeerOutput out;
  out.stdout_text = ReadAll(out_pipe[0]);
  close(out_pipe[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  out.stderr_tail = Tail(err_fd);
  close(err_fd);
  for (absl::string_view line : absl::StrSplit(out.stdout_text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() != '{') continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) out.lines.push_back(std::move(j));
  }
  return out;
}

std::string PeerFailure(const PeerOutput& out) {
  for (const nlohmann::json& j : out.lines) {
    if (j.contains("error") && j["error"].is_string()) return j["error"].get<std::string>();
  }
  std::string tail(absl::StripAsciiWhitespace(out.stderr_tail));
  if (tail.size() > 600) tail = "..." + tail.substr(tail.size() - 600);
  return absl::StrCat("exit status ", out.exit_code, tail.empty() ? "" : ": ", tail);
}

absl::StatusOr<std::string> FindVenvPython(const std::string& flag, bool make_venv, std::string* how) {
  if (!flag.empty()) {
    if (!Executable(flag)) {
      return absl::NotFoundError(absl::StrCat("--python ", flag, " is not an executable file"));
    }
    *how = "--python";
    return flag;
  }
  if (const char* env = std::getenv("STRATA_PYTHON"); env != nullptr && *env != '\0') {
    if (!Executable(env)) {
      return absl::NotFoundError(absl::StrCat("$STRATA_PYTHON=", env, " is not an executable file"));
    }
    *how = "$STRATA_PYTHON";
    return std::string(env);
  }
  const std::string repo_venv = std::string(STRATA_BENCH_SOURCE_ROOT) + "/.venv/bin/python";
  if (Executable(repo_venv)) {
    *how = "the repository's .venv";
    return repo_venv;
  }
  if (Executable(STRATA_BENCH_CONFIGURED_PYTHON)) {
    *how = "STRATA_PYTHON of the build";
    return std::string(STRATA_BENCH_CONFIGURED_PYTHON);
  }
  if (make_venv) {
    const std::string script = std::string(STRATA_BENCH_SOURCE_ROOT) + "/scripts/venv.sh";
    std::printf("no venv found: making one with bash %s (torch, DeepSpeed from PyPI; minutes)\n",
                script.c_str());
    std::fflush(stdout);
    absl::StatusOr<PeerOutput> out = RunPeerProcess(PeerCommand{{"bash", script}, {}});
    if (!out.ok()) return out.status();
    std::string path(absl::StripAsciiWhitespace(out->stdout_text));
    if (size_t nl = path.rfind('\n'); nl != std::string::npos) path = path.substr(nl + 1);
    if (out->exit_code != 0 || !Executable(path + "/bin/python")) {
      return absl::UnavailableError(absl::StrCat("scripts/venv.sh failed: ", PeerFailure(*out)));
    }
    *how = "made by scripts/venv.sh";
    return path + "/bin/python";
  }
  return absl::NotFoundError(absl::StrCat(
      "no venv with torch 2.x and DeepSpeed found (not --python, $STRATA_PYTHON, ", repo_venv,
      " or the build's STRATA_PYTHON); pass --make-venv to create it with scripts/venv.sh"));
}

}  // namespace strata
