#include "examples/rank_launcher.h"

#include <signal.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/errno_status.h"

namespace strata {
namespace {

std::string DescribeExit(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(wait_status), " (",
                        strsignal(WTERMSIG(wait_status)), ")");
  }
  return absl::StrCat("ended with wait status ", wait_status);
}

[[noreturn]] void RunChild(uint32_t rank, absl::FunctionRef<absl::Status(uint32_t)> body) {
  absl::Status status = body(rank);
  if (!status.ok()) std::fprintf(stderr, "rank %u: %s\n", rank, status.ToString().c_str());
  std::fflush(nullptr);
  // _exit, not exit: the launcher's atexit handlers and static destructors
  // (and the ShmWorld it owns) belong to the launcher.
  _exit(status.ok() ? 0 : 1);
}

}  // namespace

absl::Status RunRanks(uint32_t world_size, absl::FunctionRef<absl::Status(uint32_t rank)> body) {
  // Anything buffered now would otherwise be printed once per child too.
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  std::vector<std::string> failures;
  for (uint32_t rank = 0; rank < world_size; ++rank) {
    pid_t pid = fork();
    if (pid == 0) RunChild(rank, body);
    if (pid < 0) {
      failures.push_back(absl::StrCat("could not start rank ", rank, ": ",
                                      ErrnoToStatus(errno, "fork").message()));
      break;
    }
    pids.push_back(pid);
  }

  bool terminated_others = false;
  auto terminate_running = [&] {
    if (terminated_others) return;
    terminated_others = true;
    for (pid_t pid : pids) {
      if (pid > 0) kill(pid, SIGTERM);
    }
  };
  if (!failures.empty()) terminate_running();

  size_t running = pids.size();
  while (running > 0) {
    int wait_status = 0;
    pid_t pid = waitpid(-1, &wait_status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "waiting for the ranks");
    }
    uint32_t rank = 0;
    while (rank < pids.size() && pids[rank] != pid) ++rank;
    if (rank == pids.size()) continue;  // not one of ours
    pids[rank] = -1;
    --running;
    if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) continue;
    failures.push_back(absl::StrCat("rank ", rank, " ", DescribeExit(wait_status),
                                    terminated_others ? "" : " (the first to fail)"));
    terminate_running();
  }
  if (failures.empty()) return absl::OkStatus();
  return absl::AbortedError(absl::StrJoin(failures, "; "));
}

}  // namespace strata
