// The daemon's configuration: read from a file (protobuf text format or
// JSON, schema proto/strata/v1/config.proto), overridden by flags, then
// resolved once into typed, validated DaemonSettings.
#ifndef STRATA_DAEMON_DAEMON_CONFIG_H_
#define STRATA_DAEMON_DAEMON_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/request_limits.h"
#include "strata/v1/config.pb.h"

namespace strata {

// kNone: no device tier (jobs asking for a device budget are refused).
enum class DeviceChoice : uint8_t { kAuto, kCuda, kEmulated, kNone };
enum class IoEngineChoice : uint8_t { kAuto, kUring, kAio, kPsync };
enum class FsyncPolicy : uint8_t { kEveryCommit, kBatched, kNever };

struct DaemonSettings {
  std::string socket_path;
  std::string tcp_address;
  std::string allowed_group;
  DeviceChoice device = DeviceChoice::kAuto;
  uint64_t device_capacity_bytes = 0;
  uint64_t pinned_capacity_bytes = 0;
  std::vector<std::string> nvme_paths;
  uint64_t nvme_capacity_bytes = 0;
  IoEngineChoice io_engine = IoEngineChoice::kAuto;
  uint64_t io_block_size = 0;
  uint32_t io_queue_depth = 0;
  bool io_sqpoll = false;
  FsyncPolicy fsync_policy = FsyncPolicy::kBatched;
  uint32_t optimizer_threads = 0;
  bool pin_optimizer_threads = false;
  uint32_t job_worker_threads = 0;  // the shared job worker pool (>= 1)
  absl::Duration reattach_timeout;
  absl::Duration lease_timeout;
  uint32_t metrics_port = 0;
  // Hardening (docs/SECURITY.md).
  std::string admin_group;
  std::string tcp_token_file;
  std::string checkpoint_root;  // empty: checkpoints refused
  // Per non-admin uid: 0 = a quarter of checkpoint_root's filesystem,
  // UINT64_MAX = no limit (daemon/checkpoint_quota.h).
  uint64_t checkpoint_quota_bytes = 0;
  RequestLimits limits;
};

// Reads `path` as JSON when its first non-blank character is '{', else as
// protobuf text format. Unknown fields are InvalidArgument naming the field.
absl::StatusOr<strata::v1::DaemonConfig> LoadDaemonConfigFile(const std::string& path);

// Fills defaults and validates every field; InvalidArgument names the field
// and what it accepts. `environment_runtime_dir` is $XDG_RUNTIME_DIR (may be
// empty), passed in so the result does not depend on hidden globals.
absl::StatusOr<DaemonSettings> ResolveDaemonSettings(const strata::v1::DaemonConfig& config,
                                                     const std::string& environment_runtime_dir);

// One "key: value" line per setting, for the startup log and `strata status`.
std::string DescribeDaemonSettings(const DaemonSettings& settings);

}  // namespace strata

#endif  // STRATA_DAEMON_DAEMON_CONFIG_H_
