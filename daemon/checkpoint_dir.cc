#include "daemon/checkpoint_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/errno_status.h"
#include "core/status_macros.h"

namespace strata {
namespace {

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

absl::Status OpenErrno(int err, const std::string& what) {
  if (err == ELOOP || err == ENOTDIR) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is a symbolic link or not a directory; checkpoint paths may not pass through links"));
  }
  return ErrnoToStatus(err, what);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> CheckpointComponents(const std::string& root, const std::string& path) {
  if (root.empty()) {
    return absl::FailedPreconditionError(
        "checkpoints are off: this daemon has no checkpoint_root (start stratad with --checkpoint_root DIR, or "
        "--nvme_path, whose checkpoints/ folder is the default)");
  }
  if (path.empty()) return absl::InvalidArgumentError("checkpoint directory: the path is empty");
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("checkpoint directory: the path holds a NUL byte");
  }
  absl::string_view rest = path;
  if (rest.front() == '/') {
    std::string prefix = root;
    while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
    if (!absl::ConsumePrefix(&rest, prefix) || (!rest.empty() && rest.front() != '/')) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint directory '", path, "' is outside your checkpoint home ",
                                                     root, "; give a path relative to it"));
    }
  }
  std::vector<std::string> parts;
  for (absl::string_view part : absl::StrSplit(rest, '/', absl::SkipEmpty())) {
    if (part == "." || part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint directory '", path, "': '", part, "' components are not allowed"));
    }
    if (part.size() > 255) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint directory '", path, "': a component is over 255 bytes"));
    }
    parts.emplace_back(part);
  }
  if (parts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint directory '", path, "' names checkpoint_root itself; name a directory beneath it"));
  }
  if (parts.size() > 32) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint directory '", path, "' is more than 32 levels deep"));
  }
  return parts;
}

std::string CheckpointScope::HomePath() const {
  if (root.empty()) return "";
  std::string path = root;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  for (const std::string& part : home) absl::StrAppend(&path, path == "/" ? "" : "/", part);
  return path;
}

CheckpointScope ScopeFor(const std::string& root, uid_t uid, bool admin, uid_t daemon_uid) {
  CheckpointScope scope;
  scope.root = root;
  if (!admin) scope.home = {"users", absl::StrCat(uid)};
  if (uid != daemon_uid) scope.owner = uid;
  return scope;
}

namespace {

// Opens (making it when missing) directory `name` in `parent`, never through
// a link. A directory this call made gets `mode` exactly (mkdir's mode is cut
// by the umask) and, with `owner`, is given to it. `made` says which.
absl::StatusOr<UniqueFd> OpenOrMakeDir(int parent, const std::string& name, mode_t mode,
                                       std::optional<uid_t> owner, const std::string& display, bool* made) {
  *made = mkdirat(parent, name.c_str(), mode) == 0;
  if (!*made && errno != EEXIST) return ErrnoToStatus(errno, absl::StrCat("creating ", display));
  UniqueFd fd(openat(parent, name.c_str(), kDirFlags));
  if (!fd.valid()) return OpenErrno(errno, display);
  if (*made) {
    if (fchmod(fd.get(), mode) != 0) return ErrnoToStatus(errno, absl::StrCat("chmod ", display));
    if (owner.has_value() && fchown(fd.get(), *owner, static_cast<gid_t>(-1)) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("giving ", display, " to uid ", *owner));
    }
  }
  return fd;
}

// <root>/users/<uid>: `users` is the daemon's (0711: each user reaches only
// the home it knows the name of, and lists none), the home the user's (0700).
// An existing home must be a directory owned by that uid: anything else
// (another uid's, a file) is refused rather than used.
absl::StatusOr<UniqueFd> OpenUserHome(UniqueFd root, const CheckpointScope& scope) {
  struct stat st {};
  if (fstat(root.get(), &st) != 0) return ErrnoToStatus(errno, "stat checkpoint_root");
  // Users must pass through the root to reach their homes; it may have been
  // made 0700 by an earlier daemon. Search only (x), never listing (r).
  if (st.st_uid == geteuid() && (st.st_mode & 0011) != 0011) {
    if (fchmod(root.get(), (st.st_mode & 07777) | 0011) != 0) return ErrnoToStatus(errno, "chmod checkpoint_root");
  }
  bool made = false;
  STRATA_ASSIGN_OR_RETURN(UniqueFd users,
                          OpenOrMakeDir(root.get(), scope.home[0], 0711, std::nullopt, "checkpoint_root/users", &made));
  if (fstat(users.get(), &st) != 0) return ErrnoToStatus(errno, "stat checkpoint_root/users");
  if (st.st_uid != geteuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint_root/users belongs to uid ", st.st_uid, ", not the daemon's; an admin must remove or chown it"));
  }
  if (scope.home.size() < 2) return users;
  const std::string display = absl::StrCat("checkpoint_root/", scope.home[0], "/", scope.home[1]);
  STRATA_ASSIGN_OR_RETURN(UniqueFd home, OpenOrMakeDir(users.get(), scope.home[1], 0700, scope.owner, display, &made));
  if (fstat(home.get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat("stat ", display));
  const uid_t expected = scope.owner.value_or(geteuid());
  if (st.st_uid != expected) {
    return absl::FailedPreconditionError(absl::StrCat(display, " belongs to uid ", st.st_uid, ", not uid ", expected,
                                                      "; an admin must remove or chown it"));
  }
  return home;
}

}  // namespace

absl::StatusOr<CheckpointPlace> ResolveCheckpointPlace(const CheckpointScope& scope, const std::string& path,
                                                       bool create_parents) {
  const std::string home_path = scope.HomePath();
  auto parts = CheckpointComponents(home_path, path);
  if (!parts.ok()) return parts.status();
  const std::string& root = scope.root;
  // The root is the operator's choice (it may be a link); made when missing,
  // 0711 so that users reach their homes beneath it.
  if (mkdir(root.c_str(), 0711) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("creating checkpoint_root ", root));
  }
  UniqueFd dir(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return ErrnoToStatus(errno, absl::StrCat("opening checkpoint_root ", root));
  if (!scope.home.empty()) {
    STRATA_ASSIGN_OR_RETURN(dir, OpenUserHome(std::move(dir), scope));
  }
  UniqueFd home(fcntl(dir.get(), F_DUPFD_CLOEXEC, 0));
  if (!home.valid()) return ErrnoToStatus(errno, "dup of the checkpoint home");
  std::string walked;
  for (size_t i = 0; i + 1 < parts->size(); ++i) {
    const std::string& name = (*parts)[i];
    walked = walked.empty() ? name : absl::StrCat(walked, "/", name);
    if (create_parents) {
      bool made = false;
      STRATA_ASSIGN_OR_RETURN(dir, OpenOrMakeDir(dir.get(), name, 0700, scope.owner, walked, &made));
      continue;
    }
    UniqueFd fd(openat(dir.get(), name.c_str(), kDirFlags));
    if (!fd.valid()) {
      const int err = errno;
      if (err == ENOENT) return absl::NotFoundError(absl::StrCat(walked, " does not exist under your checkpoint home"));
      return OpenErrno(err, walked);
    }
    dir = std::move(fd);
  }
  const std::string display = absl::StrJoin(*parts, "/");
  std::string absolute = home_path;
  absl::StrAppend(&absolute, absolute == "/" ? "" : "/", display);
  return CheckpointPlace{std::move(dir), parts->back(), display, std::move(absolute), std::move(home)};
}

absl::StatusOr<UniqueFd> OpenCheckpointDir(const CheckpointPlace& place) {
  UniqueFd fd(openat(place.parent.get(), place.leaf.c_str(), kDirFlags));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("no checkpoint at ", place.display));
    return OpenErrno(err, place.display);
  }
  return fd;
}

}  // namespace strata
