#include "bench/io_fio.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/errno_status.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace strata {
namespace {

// Runs argv, waits, returns the exit status; stdout/stderr go to `log_path`.
absl::StatusOr<int> Spawn(const std::vector<std::string>& argv, const std::string& log_path,
                          const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    absl::string_view kv(*e);
    bool replaced = false;
    for (const std::string& x : extra_env) {
      if (kv.substr(0, kv.find('=') + 1) == absl::string_view(x).substr(0, x.find('=') + 1)) replaced = true;
    }
    if (!replaced) env_strings.emplace_back(kv);
  }
  for (const std::string& x : extra_env) env_strings.push_back(x);
  std::vector<char*> cenv;
  for (std::string& e : env_strings) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid;
  int rc = posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return ErrnoToStatus(rc, absl::StrCat("starting ", argv[0]));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoToStatus(errno, absl::StrCat("waiting for ", argv[0]));
  }
  if (!WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::vector<std::string> FioArguments(const FioJob& job) {
  std::vector<std::string> a = {
      "--name=strata_peer",
      absl::StrCat("--filename=", job.filename),
      absl::StrCat("--rw=", job.op == IoOp::kRead ? "read" : "write"),
      absl::StrCat("--bs=", job.block_size_bytes),
      "--direct=1",
      "--thread",
      "--time_based=1",
      absl::StrCat("--runtime=", absl::ToInt64Milliseconds(job.runtime), "ms"),
      "--invalidate=0",
      "--group_reporting=1",
      "--output-format=json",
      absl::StrCat("--output=", job.output_path),
  };
  if (!job.iomem.empty()) a.push_back(absl::StrCat("--iomem=", job.iomem));
  switch (job.engine) {
    case IoEngineKind::kUring:
      a.push_back("--ioengine=io_uring");
      a.push_back(absl::StrCat("--iodepth=", job.queue_depth));
      a.push_back(absl::StrCat("--size=", job.file_size_bytes));
      if (job.fixed_buffers_and_files) {
        a.push_back("--fixedbufs=1");
        a.push_back("--registerfiles=1");
      }
      if (job.sqpoll) a.push_back("--sqthread_poll=1");
      break;
    case IoEngineKind::kAio:
      a.push_back("--ioengine=libaio");
      a.push_back(absl::StrCat("--iodepth=", job.queue_depth));
      a.push_back(absl::StrCat("--size=", job.file_size_bytes));
      break;
    case IoEngineKind::kPsync: {
      // `depth` synchronous streams, one per thread, each over its own slice.
      uint64_t slice = job.file_size_bytes / job.queue_depth;
      slice -= slice % job.block_size_bytes;
      a.push_back("--ioengine=psync");
      a.push_back("--iodepth=1");
      a.push_back(absl::StrCat("--numjobs=", job.queue_depth));
      a.push_back(absl::StrCat("--size=", slice));
      a.push_back(absl::StrCat("--offset_increment=", slice));
      break;
    }
  }
  return a;
}

absl::StatusOr<double> ParseFioBandwidth(absl::string_view json, IoOp op) {
  // fio may print warnings before the JSON object.
  size_t start = json.find('{');
  if (start == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("fio report has no JSON: ", json.substr(0, 200)));
  }
  nlohmann::json j = nlohmann::json::parse(json.substr(start), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("jobs") || !j["jobs"].is_array() || j["jobs"].empty()) {
    return absl::InvalidArgumentError("fio report: no \"jobs\" array");
  }
  const char* side = op == IoOp::kRead ? "read" : "write";
  double total = 0;
  for (const auto& job : j["jobs"]) {
    if (!job.contains(side) || !job[side].contains("bw_bytes")) {
      return absl::InvalidArgumentError(absl::StrCat("fio report: a job lacks ", side, ".bw_bytes"));
    }
    if (job.contains("error") && job["error"].is_number() && job["error"].get<int>() != 0) {
      return absl::InternalError(absl::StrCat("fio job failed with error ", job["error"].get<int>()));
    }
    total += job[side]["bw_bytes"].get<double>();
  }
  return total;
}

absl::StatusOr<std::string> FioVersion() {
  char tmpl[] = "/var/tmp/strata-fio-version.XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) return ErrnoToStatus(errno, "creating a temporary file");
  close(fd);
  absl::StatusOr<int> rc = Spawn({"fio", "--version"}, tmpl);
  std::string out = ReadFile(tmpl);
  unlink(tmpl);
  if (!rc.ok() || *rc != 0) {
    return absl::NotFoundError("fio is not installed (apt-get install fio); measuring without the peer");
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

absl::StatusOr<double> RunFio(const FioJob& job) {
  std::vector<std::string> argv = {"fio"};
  for (std::string& a : FioArguments(job)) argv.push_back(std::move(a));
  std::string log = job.output_path + ".log";
  std::vector<std::string> env;
  if (job.thp_malloc) env.push_back("GLIBC_TUNABLES=glibc.malloc.hugetlb=1");
  STRATA_ASSIGN_OR_RETURN(int rc, Spawn(argv, log, env));
  std::string report = ReadFile(job.output_path);
  std::string log_text = ReadFile(log);
  unlink(log.c_str());
  unlink(job.output_path.c_str());
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("fio exited with status ", rc, ": ", log_text.substr(0, 500)));
  }
  STRATA_ASSIGN_OR_RETURN(double bytes_per_s, ParseFioBandwidth(report, job.op));
  return bytes_per_s / 1e6;
}

}  // namespace strata
