#include "tiers/pinned_arena.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "core/byte_size.h"
#include "core/errno_status.h"

#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1  // Linux 4.4
#endif

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack the name
#endif

namespace strata {
namespace {

constexpr uint64_t kPageBytes = 4096;

// Bytes this process has locked already (VmLck in /proc/self/status), so the
// limit is checked against what the new arena adds to it.
uint64_t LockedBytesNow() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmLck:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, "kB");
    uint64_t kib = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) return kib * 1024;
  }
  return 0;
}

std::string LimitText(rlim_t limit) {
  return limit == RLIM_INFINITY ? "unlimited" : FormatBytes(limit);
}

// Raises RLIMIT_MEMLOCK so that `need` bytes can be locked; OK if it already
// allows that. Root (CAP_SYS_RESOURCE) may raise the hard limit too.
absl::Status EnsureMemlockLimit(uint64_t need) {
  rlimit limit;
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
    return ErrnoToStatus(errno, "reading RLIMIT_MEMLOCK");
  }
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= need) return absl::OkStatus();
  rlimit raised = limit;
  raised.rlim_cur = need;
  if (raised.rlim_max != RLIM_INFINITY && raised.rlim_max < need) raised.rlim_max = need;
  if (setrlimit(RLIMIT_MEMLOCK, &raised) == 0) return absl::OkStatus();
  const int err = errno;
  return absl::ResourceExhaustedError(absl::StrCat(
      "locking ", FormatBytes(need), " of pinned host memory: RLIMIT_MEMLOCK is ",
      LimitText(limit.rlim_cur), " (hard ", LimitText(limit.rlim_max),
      ") and raising it failed (", ErrnoName(err),
      "); raise `ulimit -l` (LimitMEMLOCK=infinity in a systemd unit, --ulimit memlock=-1 "
      "for docker) or shrink the pinned tier"));
}

}  // namespace

absl::StatusOr<PinnedArena> PinnedArena::Create(const PinnedArenaOptions& options) {
  if (options.size_bytes == 0 || options.size_bytes % kPageBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pinned arena '", options.name, "': size must be a positive multiple of 4096, got ",
        options.size_bytes));
  }
  PinnedArena arena;
  arena.size_ = options.size_bytes;
  arena.fd_ = memfd_create(options.name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (arena.fd_ < 0) return ErrnoToStatus(errno, absl::StrCat("memfd_create '", options.name, "'"));
  if (ftruncate(arena.fd_, static_cast<off_t>(options.size_bytes)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("sizing pinned arena '", options.name, "' to ",
                                             FormatBytes(options.size_bytes)));
  }
  // The fd is handed to other processes: seal its size, so no holder can
  // shrink it under our mapping (a SIGBUS in the daemon) or grow it.
  if (fcntl(arena.fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("sealing pinned arena '", options.name, "'"));
  }
  void* mapped = mmap(nullptr, options.size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                      arena.fd_, 0);
  if (mapped == MAP_FAILED) {
    return ErrnoToStatus(errno, absl::StrCat("mapping pinned arena '", options.name, "'"));
  }
  arena.data_ = static_cast<std::byte*>(mapped);
  if (options.huge_pages) {
    // Advice only: refused (EINVAL) where THP is compiled out; not an error.
    arena.huge_pages_advised_ = madvise(mapped, options.size_bytes, MADV_HUGEPAGE) == 0;
  }
  // Populate every page now. MADV_POPULATE_WRITE faults them in with one
  // call; kernels before 5.14 (EINVAL) get a touch loop, one write per page.
  // A window populates nothing.
  if (options.populate && madvise(mapped, options.size_bytes, MADV_POPULATE_WRITE) != 0) {
    if (errno != EINVAL) {
      return ErrnoToStatus(errno, absl::StrCat("populating pinned arena '", options.name,
                                               "' of ", FormatBytes(options.size_bytes)));
    }
    for (uint64_t off = 0; off < options.size_bytes; off += kPageBytes) {
      std::memset(arena.data_ + off, 0, 1);
    }
  }
  if (options.lock != MemoryLockMode::kOff) {
    // Raise the limit where permitted, then lock. A failed raise is not yet
    // an error: CAP_IPC_LOCK lets mlock ignore the limit altogether.
    absl::Status limit = EnsureMemlockLimit(LockedBytesNow() + options.size_bytes);
    absl::Status status;
    // A window locks each page as it is faulted in; RLIMIT_MEMLOCK is still
    // checked against the whole range (the kernel counts the range as locked).
    const int locked = options.populate ? mlock(mapped, options.size_bytes)
                                        : mlock2(mapped, options.size_bytes, MLOCK_ONFAULT);
    if (locked != 0) {
      const int err = errno;
      status = !limit.ok() ? limit
                           : absl::ResourceExhaustedError(absl::StrCat(
                                 "mlock of ", FormatBytes(options.size_bytes),
                                 " for pinned arena '", options.name, "' failed (",
                                 ErrnoName(err),
                                 "); check RLIMIT_MEMLOCK (`ulimit -l`) and free memory"));
    }
    if (status.ok()) {
      arena.locked_ = true;
    } else if (options.lock == MemoryLockMode::kRequire) {
      return status;
    } else {
      arena.lock_note_ = std::string(status.message());
    }
  }
  return arena;
}

absl::Status PinnedArena::Discard(uint64_t offset, uint64_t bytes) {
  if (offset % kPageBytes != 0 || bytes % kPageBytes != 0 || offset > size_ || bytes > size_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat("discarding [", offset, ", +", bytes, ") of a pinned arena of ",
                                                   size_, " bytes: the range must be 4096-aligned and inside it"));
  }
  if (bytes == 0) return absl::OkStatus();
  // KEEP_SIZE: the memfd is sealed against shrinking; a hole does not shrink it.
  if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                static_cast<off_t>(bytes)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("punching [", offset, ", +", bytes, ") out of a pinned arena"));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> PinnedArena::ResidentBytes() const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) return ErrnoToStatus(errno, "stat of a pinned arena's memfd");
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

PinnedArena::PinnedArena(PinnedArena&& other) noexcept { *this = std::move(other); }

PinnedArena& PinnedArena::operator=(PinnedArena&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    fd_ = std::exchange(other.fd_, -1);
    locked_ = std::exchange(other.locked_, false);
    huge_pages_advised_ = std::exchange(other.huge_pages_advised_, false);
    lock_note_ = std::move(other.lock_note_);
  }
  return *this;
}

PinnedArena::~PinnedArena() { Reset(); }

void PinnedArena::Reset() {
  if (data_ != nullptr) munmap(data_, size_);  // also drops the lock
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  fd_ = -1;
  size_ = 0;
  locked_ = false;
}

}  // namespace strata
