// How many checkpoint bytes each user may keep under its checkpoint home
// (daemon/checkpoint_dir.h), so that one user's saves cannot fill the
// filesystem other users' checkpoints (and the daemon's NVMe tier, by
// default beside them) live on. Admins are not limited.
#ifndef STRATA_DAEMON_CHECKPOINT_QUOTA_H_
#define STRATA_DAEMON_CHECKPOINT_QUOTA_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace strata {

// The bytes (blocks allocated) of every regular file beneath `dir_fd`,
// walked without following links. A tree deeper than `max_depth` or with more
// than `max_entries` entries is ResourceExhausted: a user's home is the
// user's to fill, and a walk of it must stay bounded.
absl::StatusOr<uint64_t> BytesBeneath(int dir_fd, uint32_t max_depth = 40, uint64_t max_entries = uint64_t{1} << 20);

class CheckpointQuota {
 public:
  static constexpr uint64_t kNoLimit = UINT64_MAX;
  // `configured`: bytes per user; 0 = a quarter of the filesystem holding the
  // home; kNoLimit = none.
  explicit CheckpointQuota(uint64_t configured) : configured_(configured) {}

  // The limit for a home on the filesystem of `fd` (any fd on it).
  absl::StatusOr<uint64_t> LimitOn(int fd) const;
  // The same, for a path (GetStatus reports it before any home exists); 0
  // when the path cannot be looked at.
  uint64_t LimitAt(const std::string& path) const;

  // Held across one user's save: its usage is measured, then the save runs
  // bounded by what is left, and no second save of that user runs beside it
  // on the same measurement.
  absl::Mutex* SaveLockOf(uid_t uid);

 private:
  const uint64_t configured_;
  absl::Mutex mu_;
  absl::flat_hash_map<uid_t, std::unique_ptr<absl::Mutex>> save_locks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_DAEMON_CHECKPOINT_QUOTA_H_
