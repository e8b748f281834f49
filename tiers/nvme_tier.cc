#include "tiers/nvme_tier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"
#include "core/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<NvmeTier>> NvmeTier::Create(ExtentStore* store,
                                                          const NvmeTierOptions& options) {
  const uint64_t unit = options.allocation_unit_bytes;
  if (unit == 0 || (unit & (unit - 1)) != 0) {
    return absl::InvalidArgumentError("nvme tier: allocation unit must be a power of two");
  }
  const uint64_t store_capacity = store->Stats().capacity_bytes;
  uint64_t capacity = options.capacity_bytes;
  if (capacity == 0) capacity = store_capacity - store_capacity / 16;
  if (capacity > store_capacity) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nvme tier: capacity ", FormatBytes(capacity), " exceeds the extent store's ",
        FormatBytes(store_capacity)));
  }
  return std::unique_ptr<NvmeTier>(new NvmeTier(store, options, capacity));
}

NvmeTier::NvmeTier(ExtentStore* store, const NvmeTierOptions& options, uint64_t capacity_bytes)
    : store_(store), options_(options), capacity_bytes_(capacity_bytes) {}

uint64_t NvmeTier::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_bytes_;
}

uint64_t NvmeTier::FootprintBytes(uint64_t size_bytes) const {
  const uint64_t unit = options_.allocation_unit_bytes;
  return (std::max<uint64_t>(size_bytes, 1) + unit - 1) & ~(unit - 1);
}

absl::StatusOr<TierSlot> NvmeTier::Allocate(const ShardKey& key, uint64_t size_bytes) {
  const uint64_t footprint = FootprintBytes(size_bytes);
  absl::MutexLock lock(&mu_);
  if (used_bytes_ + footprint > capacity_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "nvme tier: no room for ", ShardKeyToString(key), " (", FormatBytes(footprint), "): ",
        FormatBytes(used_bytes_), " of ", FormatBytes(capacity_bytes_), " used"));
  }
  used_bytes_ += footprint;
  const uint64_t id = next_slot_id_++;
  slots_[id] = key;
  return TierSlot{id, 0, size_bytes, footprint};
}

void NvmeTier::Free(const TierSlot& slot) {
  ShardKey key;
  {
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(slot.id);
    if (it == slots_.end()) return;
    key = it->second;
    slots_.erase(it);
    used_bytes_ -= slot.footprint_bytes;
  }
  // NotFound: the slot was never written. Other errors cannot be returned
  // from Free; the extent is then reclaimed when the key is written again.
  if (options_.delete_on_free) (void)store_->Delete(key);
}

absl::StatusOr<ShardKey> NvmeTier::KeyOf(const TierSlot& slot) const {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(slot.id);
  if (it == slots_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("nvme tier: unknown slot ", slot.id));
  }
  return it->second;
}

absl::Status NvmeTier::Write(const TierSlot& slot, absl::Span<const std::byte> src) {
  STRATA_ASSIGN_OR_RETURN(ShardKey key, KeyOf(slot));
  if (src.size() != slot.size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nvme tier: writing ", src.size(), " bytes of ", ShardKeyToString(key),
        " into a slot of ", slot.size_bytes));
  }
  STRATA_RETURN_IF_ERROR(store_->Write(key, src));
  if (options_.commit_each_write) return store_->Commit();
  return absl::OkStatus();
}

absl::Status NvmeTier::Read(const TierSlot& slot, absl::Span<std::byte> dst) {
  STRATA_ASSIGN_OR_RETURN(ShardKey key, KeyOf(slot));
  STRATA_ASSIGN_OR_RETURN(uint64_t size, store_->Read(key, dst));
  if (size != slot.size_bytes) {
    return absl::DataLossError(absl::StrCat("nvme tier: ", ShardKeyToString(key), " holds ", size,
                                            " bytes, expected ", slot.size_bytes));
  }
  return absl::OkStatus();
}

}  // namespace strata
