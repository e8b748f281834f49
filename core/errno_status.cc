#include "core/errno_status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace strata {

std::string ErrnoName(int err) {
  switch (err) {
    case ENOENT: return "ENOENT";
    case EAGAIN: return "EAGAIN";
    case EBUSY: return "EBUSY";
    case EINTR: return "EINTR";
    case ENOSPC: return "ENOSPC";
    case ENOMEM: return "ENOMEM";
    case EDQUOT: return "EDQUOT";
    case EINVAL: return "EINVAL";
    case EIO: return "EIO";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case ENOSYS: return "ENOSYS";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case EEXIST: return "EEXIST";
    case EBADF: return "EBADF";
    case EFAULT: return "EFAULT";
    case EMFILE: return "EMFILE";
    case ENOTDIR: return "ENOTDIR";
    case EISDIR: return "EISDIR";
    case EROFS: return "EROFS";
    default: return absl::StrCat("errno ", err);
  }
}

absl::Status ErrnoToStatus(int err, absl::string_view context) {
  std::string message =
      absl::StrCat(context, ": ", std::strerror(err), " (", ErrnoName(err), ")");
  switch (err) {
    case ENOENT: return absl::NotFoundError(message);
    case EAGAIN:
    case EBUSY:
    case EINTR: return absl::UnavailableError(message);
    case ENOSPC:
    case ENOMEM:
    case EDQUOT: return absl::ResourceExhaustedError(message);
    case EINVAL: return absl::InvalidArgumentError(message);
    case EIO: return absl::DataLossError(message);
    case EACCES:
    case EPERM: return absl::PermissionDeniedError(message);
    case ENOSYS:
    case EOPNOTSUPP: return absl::UnimplementedError(message);
    case EEXIST: return absl::AlreadyExistsError(message);
    default: return absl::UnknownError(message);
  }
}

}  // namespace strata
