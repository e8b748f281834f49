// Unix-domain socket helpers shared by the daemon and the client: listening
// sockets with safe permissions, peer credentials, and passing file
// descriptors (SCM_RIGHTS), which gRPC cannot do.
#ifndef STRATA_CORE_UNIX_SOCKET_H_
#define STRATA_CORE_UNIX_SOCKET_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata {

// An owned file descriptor, closed on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  int release();
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Creates `path`'s directory with mode 0700 if missing (refusing one owned by
// another user, or one writable by group or others that is not sticky),
// removes a stale socket file, binds and listens, and sets the socket file's
// mode to `mode` (0600, or 0660 when a group may attach). With `group` (not
// -1), the socket file gets that group, and a directory this process owns
// (not a shared sticky one) gets it too with mode 0750, so the group's
// members can reach the socket but not replace it. FailedPrecondition when a
// live daemon already listens there.
absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, mode_t mode, gid_t group = static_cast<gid_t>(-1));

// Connects to a listening Unix socket; NotFound/Unavailable name the path.
absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerCredentials> GetPeerCredentials(int socket_fd);

// Whether a peer may use the daemon: the daemon's own uid, root, or a member
// of `allowed_gid` (its primary or a supplementary group; -1 = no group).
bool PeerMayAttach(const PeerCredentials& peer, uid_t daemon_uid, gid_t allowed_gid);

// Sends `message` (at most 64 KiB) with `fds` attached in one sendmsg.
absl::Status SendWithFds(int socket_fd, const std::string& message, const std::vector<int>& fds);

// Receives one message (up to `max_bytes`) and any fds attached, waiting at
// most `timeout`. Received fds are owned by the caller. DeadlineExceeded on
// timeout; Unavailable when the peer closed.
struct ReceivedMessage {
  std::string bytes;
  std::vector<UniqueFd> fds;
};
absl::StatusOr<ReceivedMessage> ReceiveWithFds(int socket_fd, size_t max_bytes, absl::Duration timeout);

}  // namespace strata

#endif  // STRATA_CORE_UNIX_SOCKET_H_
