// Checkpoint directories beneath the daemon's --checkpoint_root, resolved so
// that a client's path can neither escape the root nor make the daemon
// follow a link: each component is opened with openat(O_NOFOLLOW |
// O_DIRECTORY) from its parent's fd, ".." and "." are refused, and missing
// parents are created with mkdirat (never replacing anything that exists).
// The daemon may run as root; these rules are what keep a caller from
// using it to write or read files anywhere else (docs/SECURITY.md).
#ifndef STRATA_DAEMON_CHECKPOINT_DIR_H_
#define STRATA_DAEMON_CHECKPOINT_DIR_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/unix_socket.h"

namespace strata {

// Where one caller's checkpoint paths resolve: beneath `root` (the daemon's
// checkpoint_root), inside the caller's home there. Admins' home is the root
// itself; every other uid's is <root>/users/<uid>, made on first use, owned
// by that uid and mode 0700, so no user can name, probe or fill another's
// checkpoints, and each can read its own files (strata.checkpoint reads them
// directly).
struct CheckpointScope {
  std::string root;
  // The home's components beneath the root: {} for admins, {"users", uid}.
  std::vector<std::string> home;
  // Directories made for the caller and files saved for it are given to this
  // uid (absent: left to the daemon's user).
  std::optional<uid_t> owner;

  // The caller's home as an absolute path ("" when checkpoints are off).
  std::string HomePath() const;
};

// The scope of a caller: `admin` (root, the daemon's user, the admin group)
// or not, `daemon_uid` the daemon's own uid (files it saves for itself keep
// their owner).
CheckpointScope ScopeFor(const std::string& root, uid_t uid, bool admin, uid_t daemon_uid);

// A checkpoint's place: its parent directory (open) and its own name.
struct CheckpointPlace {
  UniqueFd parent;
  std::string leaf;
  std::string display;  // home-relative path, for messages
  std::string path;     // absolute path on this host
  UniqueFd home;        // the caller's home, open (quota walks start here)
};

// The components of `path` beneath `root`: a relative path, or an absolute
// one inside `root`. InvalidArgument for an empty path, "..", ".", empty
// components, NUL bytes, components over 255 bytes, more than 32 levels, or
// an absolute path outside the root. FailedPrecondition when `root` is empty.
absl::StatusOr<std::vector<std::string>> CheckpointComponents(const std::string& root, const std::string& path);

// Resolves `path` inside the scope's home (the root is created, 0711, when
// missing; a user's home, 0700 and given to its owner). With
// `create_parents`, missing intermediate directories are made (0700, given
// to the owner). A user's home that exists but is not a directory of its
// own is FailedPrecondition.
absl::StatusOr<CheckpointPlace> ResolveCheckpointPlace(const CheckpointScope& scope, const std::string& path,
                                                       bool create_parents);

// Opens the checkpoint directory itself (O_NOFOLLOW): NotFound when absent.
absl::StatusOr<UniqueFd> OpenCheckpointDir(const CheckpointPlace& place);

}  // namespace strata

#endif  // STRATA_DAEMON_CHECKPOINT_DIR_H_
