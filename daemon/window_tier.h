// WindowTier: the daemon's pinned tier for ZeRO-Infinity params, made of the
// jobs' exchange windows.
//
// The trainer protocol gives every param shard a FIXED slot in its rank's
// exchange window (docs/DAEMON.md: the trainer maps the window once and finds
// each shard at an offset that never changes). So this tier does not hand out
// memory: Allocate(key) returns the key's own slot, found through the job's
// Locate, and only charges it against the capacity; Free gives the slot's
// pages back to the OS (the job's Discard: a hole punched in the window's
// memfd, tiers/pinned_arena.h), so the memory held is the slots the
// TieredStore keeps, not the windows' size. Footprints are by page.
//
// A job adds itself (its Locate and Discard) before its shards enter the
// store and removes itself after they left it.
//
// Thread-safe. Locate and Discard are called without the tier's lock, but
// under the TieredStore's: they must be quick and take only leaf locks.
#ifndef STRATA_DAEMON_WINDOW_TIER_H_
#define STRATA_DAEMON_WINDOW_TIER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "core/ids.h"
#include "tiers/tier.h"

namespace strata {

class WindowTier final : public Tier {
 public:
  // Where shard (rank, index) of a job lives: its slot's memory, its offset
  // in the rank's window when the job gives it (TierSlot::offset_bytes;
  // trainers find their slots by the job's layout, not by this), and the
  // slot's length (page-padded).
  struct WindowSlot {
    std::byte* data = nullptr;
    uint64_t offset = 0;
    uint64_t bytes = 0;
  };
  using Locate = std::function<WindowSlot(uint32_t rank, uint32_t index)>;
  using Discard = std::function<void(uint32_t rank, uint32_t index)>;

  // `capacity_bytes`: the daemon's pinned capacity (0: unbounded).
  explicit WindowTier(uint64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  // AlreadyExists when the job is added twice.
  absl::Status AddJob(JobId job, Locate locate, Discard discard);
  // REQUIRES: none of the job's slots is allocated.
  void RemoveJob(JobId job);

  TierKind kind() const override { return TierKind::kPinnedHost; }
  absl::string_view name() const override { return "pinned_host (exchange windows)"; }
  uint64_t capacity_bytes() const override { return capacity_bytes_ == 0 ? UINT64_MAX / 2 : capacity_bytes_; }
  uint64_t used_bytes() const override;
  uint64_t FootprintBytes(uint64_t size_bytes) const override;
  absl::StatusOr<TierSlot> Allocate(const ShardKey& key, uint64_t size_bytes) override;
  void Free(const TierSlot& slot) override;
  absl::Status Write(const TierSlot& slot, absl::Span<const std::byte> src) override;
  absl::Status Read(const TierSlot& slot, absl::Span<std::byte> dst) override;
  absl::Span<std::byte> HostView(const TierSlot& slot) override;

 private:
  struct JobWindows {
    Locate locate;
    Discard discard;
  };
  struct Allocated {
    std::shared_ptr<const JobWindows> job;
    uint32_t rank = 0;
    uint32_t index = 0;
    std::byte* data = nullptr;
  };
  absl::StatusOr<Allocated> Find(const TierSlot& slot) const;

  const uint64_t capacity_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<JobId, std::shared_ptr<const JobWindows>> jobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Allocated> slots_ ABSL_GUARDED_BY(mu_);
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_slot_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace strata

#endif  // STRATA_DAEMON_WINDOW_TIER_H_
