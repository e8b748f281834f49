#include "core/unix_socket.h"

#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/errno_status.h"

namespace strata {
namespace {

absl::StatusOr<sockaddr_un> MakeAddress(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' must be 1..",
                                                   sizeof(addr.sun_path) - 1, " bytes long"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

absl::Status EnsurePrivateDirectory(const std::string& dir, gid_t group) {
  const bool shared_group = group != static_cast<gid_t>(-1);
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoToStatus(errno, absl::StrCat("checking socket directory ", dir));
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, absl::StrCat("creating socket directory ", dir));
    }
    if (lstat(dir.c_str(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("checking socket directory ", dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory (or is a symbolic link)"));
  }
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "socket directory ", dir, " belongs to uid ", st.st_uid, ", not to this daemon (uid ",
        geteuid(), "); choose another --socket path"));
  }
  // Whoever may write the directory may replace the socket: only a sticky
  // directory (/tmp) protects our socket file from other writers.
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "socket directory ", dir, " is writable by ", (st.st_mode & S_IWOTH) != 0 ? "everyone" : "its group",
        " and not sticky; another user could replace the socket. Use a private directory"));
  }
  if (shared_group && st.st_uid == geteuid() && (st.st_mode & S_ISVTX) == 0) {
    // Our own directory: the group must be able to reach the socket in it.
    if (st.st_gid != group && chown(dir.c_str(), static_cast<uid_t>(-1), group) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("giving socket directory ", dir, " to group ", group));
    }
    if (chmod(dir.c_str(), 0750) != 0) return ErrnoToStatus(errno, absl::StrCat("chmod 0750 ", dir));
  }
  return absl::OkStatus();
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) close(fd_);
}

int UniqueFd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

absl::StatusOr<UniqueFd> ListenUnix(const std::string& path, mode_t mode, gid_t group) {
  auto addr = MakeAddress(path);
  if (!addr.ok()) return addr.status();
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    if (absl::Status s = EnsurePrivateDirectory(path.substr(0, slash), group); !s.ok()) return s;
  }
  // A socket file left by a dead daemon is removed; one that still answers is
  // a live daemon, and we must not steal its path.
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " exists and is not a socket; remove it or choose another path"));
    }
    if (ConnectUnix(path).ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("another daemon is listening on ", path, "; stop it or choose another --socket"));
    }
    unlink(path.c_str());
  }
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "creating a Unix socket");
  // Create the file with no permissions for anyone else from the start.
  mode_t old_mask = umask(0177);
  int rc = bind(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr));
  int bind_errno = errno;
  umask(old_mask);
  if (rc != 0) return ErrnoToStatus(bind_errno, absl::StrCat("binding ", path));
  if (group != static_cast<gid_t>(-1) && chown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("giving socket ", path, " to group ", group));
  }
  if (chmod(path.c_str(), mode) != 0) return ErrnoToStatus(errno, absl::StrCat("chmod ", path));
  if (listen(fd.get(), 128) != 0) return ErrnoToStatus(errno, absl::StrCat("listening on ", path));
  return fd;
}

absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path) {
  auto addr = MakeAddress(path);
  if (!addr.ok()) return addr.status();
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoToStatus(errno, "creating a Unix socket");
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    int err = errno;
    if (err == ECONNREFUSED) {
      return absl::UnavailableError(absl::StrCat("no daemon is listening on ", path,
                                                 " (connection refused); is stratad running?"));
    }
    return ErrnoToStatus(err, absl::StrCat("connecting to ", path, "; is stratad running?"));
  }
  return fd;
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int socket_fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return ErrnoToStatus(errno, "reading the peer's credentials (SO_PEERCRED)");
  }
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

bool PeerMayAttach(const PeerCredentials& peer, uid_t daemon_uid, gid_t allowed_gid) {
  if (peer.uid == daemon_uid || peer.uid == 0) return true;
  if (allowed_gid == static_cast<gid_t>(-1)) return false;
  if (peer.gid == allowed_gid) return true;
  // Supplementary groups of the peer's user.
  passwd pw{};
  passwd* found = nullptr;
  char buf[4096];
  if (getpwuid_r(peer.uid, &pw, buf, sizeof(buf), &found) != 0 || found == nullptr) return false;
  int ngroups = 64;
  std::vector<gid_t> groups(ngroups);
  if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &ngroups) < 0) return false;
  for (int i = 0; i < ngroups; ++i) {
    if (groups[i] == allowed_gid) return true;
  }
  return false;
}

absl::Status SendWithFds(int socket_fd, const std::string& message, const std::vector<int>& fds) {
  if (message.empty() || message.size() > 65536) {
    return absl::InvalidArgumentError("fd message must be 1..65536 bytes");
  }
  iovec iov{const_cast<char*>(message.data()), message.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t sent;
  do {
    sent = sendmsg(socket_fd, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent < 0) return ErrnoToStatus(errno, "sending on the fd socket");
  if (static_cast<size_t>(sent) != message.size()) {
    return absl::UnavailableError("short send on the fd socket");
  }
  return absl::OkStatus();
}

absl::StatusOr<ReceivedMessage> ReceiveWithFds(int socket_fd, size_t max_bytes, absl::Duration timeout) {
  pollfd pfd{socket_fd, POLLIN, 0};
  int ms = static_cast<int>(absl::ToInt64Milliseconds(timeout));
  int rc;
  do {
    rc = poll(&pfd, 1, ms);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) return ErrnoToStatus(errno, "waiting on the fd socket");
  if (rc == 0) return absl::DeadlineExceededError("no message on the fd socket in time");
  ReceivedMessage out;
  out.bytes.resize(max_bytes);
  iovec iov{out.bytes.data(), max_bytes};
  constexpr int kMaxFds = 16;
  char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t got;
  do {
    got = recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  if (got < 0) return ErrnoToStatus(errno, "receiving on the fd socket");
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level == SOL_SOCKET && cmsg->cmsg_type == SCM_RIGHTS) {
      size_t n = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
        out.fds.emplace_back(fd);
      }
    }
  }
  if (got == 0) return absl::UnavailableError("the peer closed the fd socket");
  if ((msg.msg_flags & MSG_CTRUNC) != 0) {
    return absl::InvalidArgumentError("too many file descriptors in one fd-socket message");
  }
  out.bytes.resize(static_cast<size_t>(got));
  return out;
}

}  // namespace strata
