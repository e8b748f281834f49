#include "daemon/scheduler_hint.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

// The kernel's struct sched_attr (sched_setattr(2)), declared here because
// <linux/sched/types.h> clashes with glibc's <sched.h>; the size field lets
// the kernel accept this first version of it.
struct SchedAttr {
  uint32_t size;
  uint32_t sched_policy;
  uint64_t sched_flags;
  int32_t sched_nice;
  uint32_t sched_priority;
  uint64_t sched_runtime;
  uint64_t sched_deadline;
  uint64_t sched_period;
};
static_assert(sizeof(SchedAttr) == 48, "SCHED_ATTR_SIZE_VER0");
using sched_attr = SchedAttr;

// glibc 2.36 has no wrappers for these two.
int GetAttr(sched_attr* attr) {
  std::memset(attr, 0, sizeof(*attr));
  return static_cast<int>(syscall(SYS_sched_getattr, 0, attr, sizeof(*attr), 0));
}

}  // namespace

absl::Status RequestShortSlice(uint64_t slice_ns) {
  sched_attr attr;
  if (GetAttr(&attr) != 0) {
    return absl::UnimplementedError(absl::StrCat("sched_getattr: ", std::strerror(errno)));
  }
  if (attr.sched_policy != SCHED_OTHER) return absl::OkStatus();  // someone chose a class for us: keep it
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, 0);  // this thread's (Linux: per-thread)
  attr.size = sizeof(attr);
  attr.sched_policy = SCHED_OTHER;
  attr.sched_flags = 0;
  attr.sched_nice = errno == 0 ? nice : 0;
  attr.sched_runtime = slice_ns;
  if (syscall(SYS_sched_setattr, 0, &attr, 0) != 0) {
    const int err = errno;
    if (err == ENOSYS) return absl::UnimplementedError("sched_setattr: not supported by this kernel");
    return absl::InvalidArgumentError(
        absl::StrCat("sched_setattr(slice ", slice_ns, " ns): ", std::strerror(err)));
  }
  return absl::OkStatus();
}

uint64_t CurrentSliceNs() {
  sched_attr attr;
  if (GetAttr(&attr) != 0) return 0;
  return attr.sched_runtime;
}

}  // namespace strata
