// PinnedHostTier: the tier in page-locked host memory, made of one memfd
// arena (see pinned_arena.h) populated and locked at creation and carved into
// 4 KiB-aligned slots, so every slot is a valid O_DIRECT buffer and a DMA
// source. The daemon shares the arena with trainers by passing arena_fd();
// Locate() tells a trainer where a shard lives in it.
//
// Thread-safe.
#ifndef STRATA_TIERS_PINNED_HOST_TIER_H_
#define STRATA_TIERS_PINNED_HOST_TIER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "tiers/pinned_arena.h"
#include "tiers/slot_allocator.h"
#include "tiers/tier.h"

namespace strata {

struct PinnedHostTierOptions {
  uint64_t capacity_bytes = 0;  // a positive multiple of slot_alignment_bytes
  // 4 KiB: the O_DIRECT alignment of every NVMe device we target.
  uint64_t slot_alignment_bytes = 4096;
  MemoryLockMode lock = MemoryLockMode::kBestEffort;
  bool huge_pages = true;
  std::string name = "strata-pinned";
};

// Where a slot lives, for a process that mapped the arena fd.
struct PinnedSlotLocation {
  int arena = 0;  // index into arena fds (one arena today)
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;
};

class PinnedHostTier final : public Tier {
 public:
  // Errors: InvalidArgument for bad options; ResourceExhausted from the
  // arena (memory, or RLIMIT_MEMLOCK under MemoryLockMode::kRequire, with the
  // limit and the fix named).
  static absl::StatusOr<std::unique_ptr<PinnedHostTier>> Create(
      const PinnedHostTierOptions& options);

  TierKind kind() const override { return TierKind::kPinnedHost; }
  absl::string_view name() const override { return "pinned_host"; }
  uint64_t capacity_bytes() const override { return options_.capacity_bytes; }
  uint64_t used_bytes() const override;
  uint64_t FootprintBytes(uint64_t size_bytes) const override;
  absl::StatusOr<TierSlot> Allocate(const ShardKey& key, uint64_t size_bytes) override;
  void Free(const TierSlot& slot) override;
  absl::Status Write(const TierSlot& slot, absl::Span<const std::byte> src) override;
  absl::Status Read(const TierSlot& slot, absl::Span<std::byte> dst) override;
  absl::Span<std::byte> HostView(const TierSlot& slot) override;

  // The arena's memfd (owned by the tier; dup it before passing it on).
  int arena_fd() const { return arena_.fd(); }
  const PinnedArena& arena() const { return arena_; }
  PinnedSlotLocation Locate(const TierSlot& slot) const;

 private:
  PinnedHostTier(const PinnedHostTierOptions& options, PinnedArena arena);

  const PinnedHostTierOptions options_;
  PinnedArena arena_;

  mutable absl::Mutex mu_;
  SlotAllocator allocator_ ABSL_GUARDED_BY(mu_);
  uint64_t next_slot_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace strata

#endif  // STRATA_TIERS_PINNED_HOST_TIER_H_
