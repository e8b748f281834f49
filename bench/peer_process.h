// Running the benchmarks' peers (torch, DeepSpeed) as child processes of the
// bench, and finding the Python that has them.
//
// The peers live in Python packages: torch 2.x and DeepSpeed in the project's
// venv (scripts/venv.sh), Debian's torch 1.13 under /usr/bin/python3. A peer
// script prints one JSON object per line on stdout; its stderr (DeepSpeed's
// build log, warnings) is kept aside and shown only when it fails.
#ifndef STRATA_BENCH_PEER_PROCESS_H_
#define STRATA_BENCH_PEER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace strata {

struct PeerCommand {
  std::vector<std::string> argv;  // argv[0] is looked up on PATH when it has no '/'
  std::vector<std::string> env;   // "NAME=value", added to (or replacing in) our environment
};

struct PeerOutput {
  int exit_code = 0;                     // -1 when killed by a signal
  std::vector<nlohmann::json> lines;     // every stdout line that parsed as a JSON object
  std::string stdout_text;
  std::string stderr_tail;               // the last 3000 characters
};

// Runs `cmd` to completion. Fails only when it cannot be started; a non-zero
// exit is returned in exit_code for the caller to judge.
absl::StatusOr<PeerOutput> RunPeerProcess(const PeerCommand& cmd);

// A peer that serves requests: one line in on its stdin, one JSON line back
// on its stdout. Lets the bench alternate its own runs with the peer's
// without starting Python (and loading DeepSpeed) for each one.
class PeerCoprocess {
 public:
  static absl::StatusOr<std::unique_ptr<PeerCoprocess>> Start(const PeerCommand& cmd);
  ~PeerCoprocess();  // closes the peer's stdin and waits for it
  PeerCoprocess(const PeerCoprocess&) = delete;
  PeerCoprocess& operator=(const PeerCoprocess&) = delete;

  // The next JSON object the peer prints (other lines are skipped).
  // Unavailable (with the end of its stderr) once it has exited.
  absl::StatusOr<nlohmann::json> Next();
  // Sends `line` and returns the answer.
  absl::StatusOr<nlohmann::json> Request(const std::string& line);
  std::string StderrTail() const;

 private:
  PeerCoprocess() = default;
  pid_t pid_ = -1;
  int sock_ = -1;    // our end of the peer's stdin and stdout
  int err_fd_ = -1;  // its stderr, an unlinked temporary file
  std::string pending_;
};

// The Python with torch 2.x and DeepSpeed, in this order: `flag` (--python);
// $STRATA_PYTHON; <source root>/.venv/bin/python; the STRATA_PYTHON the build
// was configured with; else, when `make_venv`, runs scripts/venv.sh and uses
// the venv it made. NotFound (saying how to get one) when none exists.
// `how` gets a few words on where it came from.
absl::StatusOr<std::string> FindVenvPython(const std::string& flag, bool make_venv, std::string* how);

// A one-line summary of a failed peer run: its own "error" line if it printed
// one, else the exit status and the end of its stderr.
std::string PeerFailure(const PeerOutput& out);

}  // namespace strata

#endif  // STRATA_BENCH_PEER_PROCESS_H_
