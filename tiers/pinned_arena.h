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
