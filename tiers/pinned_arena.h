// PinnedArena: one block of page-locked host memory backed by a memfd, so it
// can later be shared with trainer processes by passing the fd.
//
// The memfd is sealed against shrinking and growing (F_SEAL_SHRINK |
// F_SEAL_GROW | F_SEAL_SEAL) once sized: its fd is handed to trainers, and a
// holder's ftruncate must fail rather than SIGBUS the daemon.
//
// Creation does all the expensive work once: memfd_create + ftruncate, a
// shared mapping, MADV_HUGEPAGE (effective where shmem transparent huge pages
// allow it), population of every page (MADV_POPULATE_WRITE, or a touch loop
// on kernels without it: a first-touch fault costs ~14 us per 4 KiB page, 3.7 s
// per GiB, which must never land on the data path), and mlock within
// RLIMIT_MEMLOCK, raising the soft (and, when permitted, hard) limit first.
// The mapping lives until the arena is destroyed; nothing unmaps it in between.
//
// A window arena (populate = false) does none of the populating: its pages
// are faulted in when first touched (by the daemon or by a trainer sharing
// the memfd) and locked as they arrive (mlock2 MLOCK_ONFAULT), and Discard
// gives a range's memory back to the OS (a hole punched in the memfd), so
// only the pages in use are resident. ZeRO-Infinity's exchange region is one:
// its virtual size covers every slot of the rank, its memory only the slots
// the job's budget keeps (docs/DAEMON.md, "the window").
//
// (These are OS specifics that STYLE.md places in core/sys/; that folder does
// not exist yet, so they live here, behind this one class.)
//
// Move-only RAII; owns the fd and the mapping. Thread-compatible (the memory
// itself is shared by whoever the owner hands it to).
#ifndef STRATA_TIERS_PINNED_ARENA_H_
#define STRATA_TIERS_PINNED_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

enum class MemoryLockMode : uint8_t {
  kRequire = 0,     // mlock or fail (ResourceExhausted naming RLIMIT_MEMLOCK and the fix)
  kBestEffort = 1,  // mlock when the limit allows; locked() says whether it did
  kOff = 2,         // never mlock (tests that must not touch the limit)
};

struct PinnedArenaOptions {
  std::string name = "strata-pinned";  // memfd name, visible in /proc/PID/fd
  uint64_t size_bytes = 0;             // > 0, a multiple of 4096
  MemoryLockMode lock = MemoryLockMode::kBestEffort;
  bool huge_pages = true;  // MADV_HUGEPAGE on the mapping
  // Fault and lock every page at creation (true), or only as pages are
  // touched (false: a window, see above).
  bool populate = true;
};

class PinnedArena {
 public:
  static absl::StatusOr<PinnedArena> Create(const PinnedArenaOptions& options);

  PinnedArena() = default;
  PinnedArena(PinnedArena&& other) noexcept;
  PinnedArena& operator=(PinnedArena&& other) noexcept;
  PinnedArena(const PinnedArena&) = delete;
  PinnedArena& operator=(const PinnedArena&) = delete;
  ~PinnedArena();

  std::byte* data() const { return data_; }
  uint64_t size_bytes() const { return size_; }
  // The memfd; owned by the arena (dup it to hand it out).
  int fd() const { return fd_; }
  bool locked() const { return locked_; }
  // MADV_HUGEPAGE was accepted (the kernel may still use 4 KiB pages when
  // shmem THP is disabled; see /sys/kernel/mm/transparent_hugepage/shmem_enabled).
  bool huge_pages_advised() const { return huge_pages_advised_; }
  // Why the arena is not locked, when kBestEffort fell back; else empty.
  const std::string& lock_note() const { return lock_note_; }

  // Gives the memory of [offset, offset + bytes) back to the OS: a hole is
  // punched in the memfd (every process mapping it sees the range read as
  // zeros, and touching it again faults in fresh zeroed pages). Both must be
  // multiples of 4096 and inside the arena (InvalidArgument otherwise).
  // Safe to call while other threads use other ranges of the arena.
  absl::Status Discard(uint64_t offset, uint64_t bytes);
  // Bytes of memory the memfd holds now (its allocated blocks), whoever
  // faulted them in: the arena's real footprint, unlike its size.
  absl::StatusOr<uint64_t> ResidentBytes() const;

 private:
  void Reset();

  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
  bool locked_ = false;
  bool huge_pages_advised_ = false;
  std::string lock_note_;
};

}  // namespace strata

#endif  // STRATA_TIERS_PINNED_ARENA_H_
