// A private stratad for a benchmark: the `stratad` binary that sits beside
// the running `strata` (found through /proc/self/exe), started on a socket in
// a scratch directory of its own, with its own NVMe directory, and stopped
// with SIGTERM when the benchmark ends. The benchmark then measures exactly
// the daemon it started, with the settings it chose, and leaves nothing
// behind. It runs under the name strata-bench-daemon (a symlink to stratad
// in the scratch directory), out of reach of a broad `pkill stratad`.
//
// BenchScratchDir is the scratch directory: created under a parent on a real
// file system (tmpfs refuses O_DIRECT, so NVMe numbers taken there would be
// memory numbers), removed with everything in it on destruction.
//
// Thread-compatible. Move-only RAII; both own what they created.
#ifndef STRATA_BENCH_DAEMON_LAUNCHER_H_
#define STRATA_BENCH_DAEMON_LAUNCHER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata {

class BenchScratchDir {
 public:
  // Creates `parent`/strata-bench-XXXXXX. `parent` empty: $TMPDIR when it is
  // not tmpfs, else /var/tmp. FailedPrecondition when the chosen parent is
  // tmpfs (name a directory on a disk instead).
  static absl::StatusOr<BenchScratchDir> Create(const std::string& parent);

  BenchScratchDir(BenchScratchDir&& other) noexcept;
  BenchScratchDir& operator=(BenchScratchDir&& other) noexcept;
  BenchScratchDir(const BenchScratchDir&) = delete;
  BenchScratchDir& operator=(const BenchScratchDir&) = delete;
  ~BenchScratchDir();  // removes the directory and its contents

  const std::string& path() const { return path_; }
  // Free bytes on the file system that holds the directory.
  absl::StatusOr<uint64_t> FreeBytes() const;

 private:
  explicit BenchScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

struct BenchDaemonOptions {
  std::string work_dir;                // holds the socket and the log; must exist
  std::string nvme_path;               // "" = no NVMe tier
  uint64_t nvme_capacity_bytes = 0;    // with nvme_path
  uint32_t optimizer_threads = 0;      // 0 = the daemon's default
  std::string fsync_policy;            // "" = the daemon's default
  std::vector<std::string> extra_args;  // appended to the command line
};

class BenchDaemon {
 public:
  // Starts stratad and waits (up to a minute) until it answers a Noop.
  // NotFound when no stratad sits beside this binary; Unavailable when it
  // exits or does not answer, with the tail of its log in the message.
  static absl::StatusOr<std::unique_ptr<BenchDaemon>> Start(const BenchDaemonOptions& options);
  ~BenchDaemon();  // Stop(), ignoring its result

  const std::string& socket_path() const { return socket_path_; }
  const std::string& log_path() const { return log_path_; }
  const std::string& binary() const { return binary_; }
  pid_t pid() const { return pid_; }  // -1 once stopped

  // SIGTERM and wait. Internal naming the exit status when the daemon did
  // not stop cleanly. Idempotent.
  absl::Status Stop();

 private:
  BenchDaemon(pid_t pid, std::string binary, std::string socket_path, std::string log_path)
      : pid_(pid), binary_(std::move(binary)), socket_path_(std::move(socket_path)),
        log_path_(std::move(log_path)) {}

  pid_t pid_ = -1;
  std::string binary_;
  std::string socket_path_;
  std::string log_path_;
};

// The running executable's directory (readlink of /proc/self/exe).
absl::StatusOr<std::string> ThisBinaryDir();
// The running executable's path.
absl::StatusOr<std::string> ThisBinary();

// The last `lines` lines of a text file ("" when unreadable).
std::string TailOfFile(const std::string& path, int lines);

// A failed bench run's status with the end of its private daemon's log
// appended (unchanged when `status` is OK or there is no private daemon).
absl::Status WithDaemonLogTail(absl::Status status, const BenchDaemon* daemon);

// Writes a bench's --json output and says so on stdout.
absl::Status WriteBenchJson(const std::string& path, const std::string& json_text);

}  // namespace strata

#endif  // STRATA_BENCH_DAEMON_LAUNCHER_H_
