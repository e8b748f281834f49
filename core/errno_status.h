// Translation of errno values into absl::Status, once, at the system-call edge.
#ifndef STRATA_CORE_ERRNO_STATUS_H_
#define STRATA_CORE_ERRNO_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace strata {

// Maps `err` to a canonical code and names the object in the message:
// "opening /nvme/a.swp: No such file or directory (ENOENT)".
//   ENOENT -> NotFound; EAGAIN, EBUSY, EINTR -> Unavailable;
//   ENOSPC, ENOMEM, EDQUOT -> ResourceExhausted; EINVAL -> InvalidArgument;
//   EIO -> DataLoss; EACCES, EPERM -> PermissionDenied;
//   ENOSYS, EOPNOTSUPP -> Unimplemented; EEXIST -> AlreadyExists;
//   anything else -> Unknown.
absl::Status ErrnoToStatus(int err, absl::string_view context);

// The symbolic name of an errno value ("ENOSPC"), or "errno N".
std::string ErrnoName(int err);

}  // namespace strata

#endif  // STRATA_CORE_ERRNO_STATUS_H_
