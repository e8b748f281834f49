#include "tiers/device_tier.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<DeviceTier>> DeviceTier::Create(Device* device,
                                                               const DeviceTierOptions& options) {
  const uint64_t align = options.slot_alignment_bytes;
  if (align == 0 || (align & (align - 1)) != 0) {
    return absl::InvalidArgumentError("device tier: slot alignment must be a power of two");
  }
  if (options.capacity_bytes == 0 || options.capacity_bytes % align != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device tier: capacity must be a positive multiple of ", align, " bytes"));
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<DeviceSlotCopier> copier, DeviceSlotCopier::Create(device, options.streams));
  absl::StatusOr<DeviceBuffer> arena = device->Allocate(options.capacity_bytes);
  if (!arena.ok()) {
    return absl::Status(arena.status().code(),
                        absl::StrCat("device tier: taking its arena from ", device->info().name,
                                     ": ", arena.status().message()));
  }
  return std::unique_ptr<DeviceTier>(
      new DeviceTier(device, options, *arena, std::move(copier)));
}

DeviceTier::DeviceTier(Device* device, const DeviceTierOptions& options, DeviceBuffer arena,
                       std::unique_ptr<DeviceSlotCopier> copier)
    : device_(device),
      options_(options),
      arena_(arena),
      copier_(std::move(copier)),
      name_(absl::StrCat("device (", device->info().name, ")")),
      allocator_(options.capacity_bytes, options.slot_alignment_bytes) {}

DeviceTier::~DeviceTier() { device_->Free(arena_); }

uint64_t DeviceTier::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return allocator_.used_bytes();
}

uint64_t DeviceTier::FootprintBytes(uint64_t size_bytes) const {
  const uint64_t align = options_.slot_alignment_bytes;
  return (std::max<uint64_t>(size_bytes, 1) + align - 1) & ~(align - 1);
}

absl::StatusOr<TierSlot> DeviceTier::Allocate(const ShardKey& key, uint64_t size_bytes) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<SlotRange> range = allocator_.Allocate(size_bytes);
  if (!range.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        name_, ": no room for ", ShardKeyToString(key), ": ", range.status().message()));
  }
  return TierSlot{next_slot_id_++, range->offset_bytes, size_bytes, range->size_bytes};
}

void DeviceTier::Free(const TierSlot& slot) {
  absl::MutexLock lock(&mu_);
  allocator_.Free(SlotRange{slot.offset_bytes, slot.footprint_bytes});
}

std::optional<Tier::FreeSpace> DeviceTier::FreeSpaceFor(const ShardKey& /*key*/) const {
  absl::MutexLock lock(&mu_);
  return FreeSpace{allocator_.free_bytes(), allocator_.largest_free_bytes()};
}

uint64_t DeviceTier::FreeRangeAfterFreeing(const TierSlot& slot) const {
  absl::MutexLock lock(&mu_);
  return allocator_.FreeRangeAfterFreeing(SlotRange{slot.offset_bytes, slot.footprint_bytes});
}

absl::Status DeviceTier::Write(const TierSlot& slot, absl::Span<const std::byte> src) {
  return copier_->ToDevice(arena_, slot, src, name_);
}

absl::Status DeviceTier::Read(const TierSlot& slot, absl::Span<std::byte> dst) {
  return copier_->ToHost(dst, arena_, slot, name_);
}

}  // namespace strata
