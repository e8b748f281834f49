#include "daemon/checkpoint_quota.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/errno_status.h"

namespace strata {
namespace {

struct Walk {
  uint32_t max_depth;
  uint64_t max_entries;
  uint64_t entries = 0;
  uint64_t bytes = 0;
};

absl::Status AddBeneath(int dir_fd, uint32_t depth, Walk* walk) {
  if (depth > walk->max_depth) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the checkpoint home is more than ", walk->max_depth, " directories deep; remove what it holds"));
  }
  // fdopendir takes the fd it is given: walk a duplicate, so `dir_fd` stays
  // the caller's.
  const int own = fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return ErrnoToStatus(errno, "dup of a checkpoint directory");
  DIR* dir = fdopendir(own);
  if (dir == nullptr) {
    const int err = errno;
    close(own);
    return ErrnoToStatus(err, "reading a checkpoint directory");
  }
  // Directory positions are per open file: rewind, as the fd may have been
  // read before.
  rewinddir(dir);
  absl::Status status;
  while (status.ok()) {
    errno = 0;
    const dirent* e = readdir(dir);
    if (e == nullptr) {
      if (errno != 0) status = ErrnoToStatus(errno, "reading a checkpoint directory");
      break;
    }
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    if (++walk->entries > walk->max_entries) {
      status = absl::ResourceExhaustedError(absl::StrCat("the checkpoint home holds more than ", walk->max_entries,
                                                         " files; remove old checkpoints"));
      break;
    }
    struct stat st {};
    if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;  // removed while we walk
      status = ErrnoToStatus(errno, absl::StrCat("stat ", e->d_name));
      break;
    }
    if (S_ISREG(st.st_mode)) {
      walk->bytes += static_cast<uint64_t>(st.st_blocks) * 512;
    } else if (S_ISDIR(st.st_mode)) {
      const int child = openat(dirfd(dir), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (child < 0) {
        if (errno == ENOENT || errno == ELOOP || errno == ENOTDIR) continue;  // changed while we walk
        status = ErrnoToStatus(errno, absl::StrCat("opening ", e->d_name));
        break;
      }
      status = AddBeneath(child, depth + 1, walk);
      close(child);
    }
  }
  closedir(dir);
  return status;
}

}  // namespace

absl::StatusOr<uint64_t> BytesBeneath(int dir_fd, uint32_t max_depth, uint64_t max_entries) {
  Walk walk{max_depth, max_entries};
  if (absl::Status s = AddBeneath(dir_fd, 0, &walk); !s.ok()) return s;
  return walk.bytes;
}

absl::StatusOr<uint64_t> CheckpointQuota::LimitOn(int fd) const {
  if (configured_ != 0) return configured_;
  struct statvfs vfs {};
  if (fstatvfs(fd, &vfs) != 0) return ErrnoToStatus(errno, "statvfs of the checkpoint home");
  return static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize / 4;
}

uint64_t CheckpointQuota::LimitAt(const std::string& path) const {
  if (configured_ != 0) return configured_;
  struct statvfs vfs {};
  if (statvfs(path.c_str(), &vfs) != 0) return 0;
  return static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize / 4;
}

absl::Mutex* CheckpointQuota::SaveLockOf(uid_t uid) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<absl::Mutex>& m = save_locks_[uid];
  if (m == nullptr) m = std::make_unique<absl::Mutex>();
  return m.get();
}

}  // namespace strata
