// NvmeTier: the tier on NVMe, over swap's ExtentStore. A slot is a name for
// one shard's extent: Allocate only reserves capacity, Write stores the shard
// (copy on write, checksummed), Read verifies and returns it, Free deletes
// it. Durability is the ExtentStore's: writes are readable at once and
// durable at its next Commit(), which the daemon schedules (or set
// `commit_each_write`).
//
// Capacity. Footprints are sizes rounded up to the extent store's allocation
// unit. Because a rewrite takes a fresh extent before the old one is freed,
// `capacity_bytes` should leave room for the largest shard below the
// store's real capacity; Create refuses a capacity above it.
//
// Thread-safe (the ExtentStore serializes its operations).
#ifndef STRATA_TIERS_NVME_TIER_H_
#define STRATA_TIERS_NVME_TIER_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "swap/extent_store.h"
#include "tiers/tier.h"

namespace strata {

struct NvmeTierOptions {
  // 0: the extent store's capacity minus one allocation unit of headroom per
  // 16, for copy-on-write rewrites.
  uint64_t capacity_bytes = 0;
  // Must equal the ExtentStore's allocation unit (its options' value).
  uint64_t allocation_unit_bytes = 64 << 10;
  bool commit_each_write = false;
  // Free deletes the shard's extent. The daemon turns it off: a job's param
  // homes outlive the job's slots in the store (a daemon restart, a job
  // reloaded after a fault adopts them) and are deleted with the job's other
  // extents (ExtentStore::DeleteOwner) when the job is.
  bool delete_on_free = true;
};

class NvmeTier final : public Tier {
 public:
  // `store` is borrowed and must outlive the tier. InvalidArgument when the
  // capacity exceeds the store's or the unit is not a power of two.
  static absl::StatusOr<std::unique_ptr<NvmeTier>> Create(ExtentStore* store,
                                                          const NvmeTierOptions& options);

  TierKind kind() const override { return TierKind::kNvme; }
  absl::string_view name() const override { return "nvme"; }
  uint64_t capacity_bytes() const override { return capacity_bytes_; }
  uint64_t used_bytes() const override;
  uint64_t FootprintBytes(uint64_t size_bytes) const override;
  absl::StatusOr<TierSlot> Allocate(const ShardKey& key, uint64_t size_bytes) override;
  void Free(const TierSlot& slot) override;
  absl::Status Write(const TierSlot& slot, absl::Span<const std::byte> src) override;
  absl::Status Read(const TierSlot& slot, absl::Span<std::byte> dst) override;
  uint64_t host_buffer_alignment() const override { return store_->alignment(); }

 private:
  NvmeTier(ExtentStore* store, const NvmeTierOptions& options, uint64_t capacity_bytes);
  absl::StatusOr<ShardKey> KeyOf(const TierSlot& slot) const;

  ExtentStore* const store_;
  const NvmeTierOptions options_;
  const uint64_t capacity_bytes_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, ShardKey> slots_ ABSL_GUARDED_BY(mu_);
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_slot_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace strata

#endif  // STRATA_TIERS_NVME_TIER_H_
