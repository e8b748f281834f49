// Checkpoint directories beneath the daemon's --checkpoint_root, resolved so
// that a client's path can neither escape the root nor make the daemon
// follow a link: each component is opened with openat(O_NOFOLLOW |
// O_DIRECTORY) from its parent's fd, ".." and "." are refused, and missing
// parents are created with mkdirat (never replacing anything that exists).
// The daemon may run as root; these rules are what keep a caller from
// using it to write or read files anywhere else (docs/SECURITY.md).
#ifndef STRATA_DAEMON_CHECKPOINT_DIR_H_
#define STRATA_DAEMON_CHECKPOINT_DIR_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/unix_socket.h"

namespace strata {

// A checkpoint's place: its parent directory (open) and its own name.
struct CheckpointPlace {
  UniqueFd parent;
  std::string leaf;
  std::string display;  // root-relative path, for messages
};

// The components of `path` beneath `root`: a relative path, or an absolute
// one inside `root`. InvalidArgument for an empty path, "..", ".", empty
// components, NUL bytes, components over 255 bytes, more than 32 levels, or
// an absolute path outside the root. FailedPrecondition when `root` is empty.
absl::StatusOr<std::vector<std::string>> CheckpointComponents(const std::string& root, const std::string& path);

// Resolves `path` beneath `root` (created, 0700, when missing). With
// `create_parents`, missing intermediate directories are made (0700).
absl::StatusOr<CheckpointPlace> ResolveCheckpointPlace(const std::string& root, const std::string& path,
                                                       bool create_parents);

// Opens the checkpoint directory itself (O_NOFOLLOW): NotFound when absent.
absl::StatusOr<UniqueFd> OpenCheckpointDir(const CheckpointPlace& place);

}  // namespace strata

#endif  // STRATA_DAEMON_CHECKPOINT_DIR_H_
