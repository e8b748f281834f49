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
      return absl::InvalidArgumentError(absl::StrCat("checkpoint directory '", path, "' is outside checkpoint_root ",
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

absl::StatusOr<CheckpointPlace> ResolveCheckpointPlace(const std::string& root, const std::string& path,
                                                       bool create_parents) {
  auto parts = CheckpointComponents(root, path);
  if (!parts.ok()) return parts.status();
  // The root is the operator's choice (it may be a link); made when missing.
  if (mkdir(root.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("creating checkpoint_root ", root));
  }
  UniqueFd dir(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return ErrnoToStatus(errno, absl::StrCat("opening checkpoint_root ", root));
  std::string walked;
  for (size_t i = 0; i + 1 < parts->size(); ++i) {
    const std::string& name = (*parts)[i];
    walked = walked.empty() ? name : absl::StrCat(walked, "/", name);
    int fd = openat(dir.get(), name.c_str(), kDirFlags);
    if (fd < 0 && errno == ENOENT && create_parents) {
      if (mkdirat(dir.get(), name.c_str(), 0700) != 0 && errno != EEXIST) {
        return ErrnoToStatus(errno, absl::StrCat("creating ", walked, " under checkpoint_root"));
      }
      fd = openat(dir.get(), name.c_str(), kDirFlags);
    }
    if (fd < 0) {
      const int err = errno;
      if (err == ENOENT) return absl::NotFoundError(absl::StrCat(walked, " does not exist under checkpoint_root"));
      return OpenErrno(err, walked);
    }
    dir = UniqueFd(fd);
  }
  return CheckpointPlace{std::move(dir), parts->back(), absl::StrJoin(*parts, "/")};
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
