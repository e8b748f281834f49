// DeviceTier: the tier in accelerator memory, over a Device (CUDA or
// emulated). At creation it takes one arena of `capacity_bytes` from the
// device and sub-allocates slots from it, so steady state never calls the
// device allocator. Copies go through a small pool of streams, so transfers
// from different store threads overlap on a real GPU.
//
// Thread-safe.
#ifndef STRATA_TIERS_DEVICE_TIER_H_
#define STRATA_TIERS_DEVICE_TIER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "tiers/device.h"
#include "tiers/device_slot_copier.h"
#include "tiers/slot_allocator.h"
#include "tiers/tier.h"

namespace strata {

struct DeviceTierOptions {
  uint64_t capacity_bytes = 0;  // must be a multiple of slot_alignment_bytes
  uint64_t slot_alignment_bytes = 4096;
  int streams = 4;
};

class DeviceTier final : public Tier {
 public:
  // `device` is borrowed and must outlive the tier. ResourceExhausted when
  // the device cannot give the arena; InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<DeviceTier>> Create(Device* device,
                                                            const DeviceTierOptions& options);
  ~DeviceTier() override;

  TierKind kind() const override { return TierKind::kDevice; }
  absl::string_view name() const override { return name_; }
  uint64_t capacity_bytes() const override { return options_.capacity_bytes; }
  uint64_t used_bytes() const override;
  uint64_t FootprintBytes(uint64_t size_bytes) const override;
  absl::StatusOr<TierSlot> Allocate(const ShardKey& key, uint64_t size_bytes) override;
  void Free(const TierSlot& slot) override;
  absl::Status Write(const TierSlot& slot, absl::Span<const std::byte> src) override;
  absl::Status Read(const TierSlot& slot, absl::Span<std::byte> dst) override;
  std::optional<FreeSpace> FreeSpaceFor(const ShardKey& key) const override;
  uint64_t FreeRangeAfterFreeing(const TierSlot& slot) const override;

  // The one device buffer every slot lies in: a slot's offset_bytes is its
  // offset in this buffer (what a trainer that mapped the arena reads at).
  DeviceBuffer arena() const { return arena_; }
  // How another process maps the arena (Device::Export of arena()).
  absl::StatusOr<DeviceExport> ExportArena() const { return device_->Export(arena_); }

 private:
  DeviceTier(Device* device, const DeviceTierOptions& options, DeviceBuffer arena,
             std::unique_ptr<DeviceSlotCopier> copier);

  Device* const device_;
  const DeviceTierOptions options_;
  const DeviceBuffer arena_;
  const std::unique_ptr<DeviceSlotCopier> copier_;
  const std::string name_;

  mutable absl::Mutex mu_;
  SlotAllocator allocator_ ABSL_GUARDED_BY(mu_);
  uint64_t next_slot_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace strata

#endif  // STRATA_TIERS_DEVICE_TIER_H_
