#include "tiers/pinned_host_tier.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<PinnedHostTier>> PinnedHostTier::Create(
    const PinnedHostTierOptions& options) {
  const uint64_t align = options.slot_alignment_bytes;
  if (align < 4096 || (align & (align - 1)) != 0) {
    return absl::InvalidArgumentError(
        "pinned host tier: slot alignment must be a power of two >= 4096 (O_DIRECT)");
  }
  if (options.capacity_bytes == 0 || options.capacity_bytes % align != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pinned host tier: capacity must be a positive multiple of ", align, " bytes"));
  }
  STRATA_ASSIGN_OR_RETURN(
      PinnedArena arena,
      PinnedArena::Create({options.name, options.capacity_bytes, options.lock, options.huge_pages}));
  return std::unique_ptr<PinnedHostTier>(new PinnedHostTier(options, std::move(arena)));
}

PinnedHostTier::PinnedHostTier(const PinnedHostTierOptions& options, PinnedArena arena)
    : options_(options),
      arena_(std::move(arena)),
      allocator_(options.capacity_bytes, options.slot_alignment_bytes) {}

uint64_t PinnedHostTier::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return allocator_.used_bytes();
}

uint64_t PinnedHostTier::FootprintBytes(uint64_t size_bytes) const {
  const uint64_t align = options_.slot_alignment_bytes;
  return (std::max<uint64_t>(size_bytes, 1) + align - 1) & ~(align - 1);
}

absl::StatusOr<TierSlot> PinnedHostTier::Allocate(const ShardKey& key, uint64_t size_bytes) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<SlotRange> range = allocator_.Allocate(size_bytes);
  if (!range.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pinned host tier: no room for ", ShardKeyToString(key), ": ", range.status().message()));
  }
  return TierSlot{next_slot_id_++, range->offset_bytes, size_bytes, range->size_bytes};
}

void PinnedHostTier::Free(const TierSlot& slot) {
  absl::MutexLock lock(&mu_);
  allocator_.Free(SlotRange{slot.offset_bytes, slot.footprint_bytes});
}

absl::Span<std::byte> PinnedHostTier::HostView(const TierSlot& slot) {
  return absl::MakeSpan(arena_.data() + slot.offset_bytes, slot.size_bytes);
}

absl::Status PinnedHostTier::Write(const TierSlot& slot, absl::Span<const std::byte> src) {
  if (src.size() != slot.size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pinned host tier: writing ", src.size(), " bytes into a slot of ", slot.size_bytes));
  }
  std::byte* dst = arena_.data() + slot.offset_bytes;
  if (src.data() != dst && !src.empty()) std::memcpy(dst, src.data(), src.size());
  return absl::OkStatus();
}

absl::Status PinnedHostTier::Read(const TierSlot& slot, absl::Span<std::byte> dst) {
  if (dst.size() < slot.size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pinned host tier: reading a slot of ", slot.size_bytes, " bytes into ", dst.size()));
  }
  const std::byte* src = arena_.data() + slot.offset_bytes;
  if (src != dst.data() && slot.size_bytes > 0) std::memcpy(dst.data(), src, slot.size_bytes);
  return absl::OkStatus();
}

PinnedSlotLocation PinnedHostTier::Locate(const TierSlot& slot) const {
  return PinnedSlotLocation{0, slot.offset_bytes, slot.size_bytes};
}

}  // namespace strata
