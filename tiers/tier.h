// Tier: one level of the memory hierarchy (device, pinned host, NVMe) as a
// store of byte slots, one slot per shard copy.
//
// A tier only allocates, frees, and moves bytes between a slot and host
// memory; which shards live where, pins, leases and eviction are the
// TieredStore's business. Implementations: DeviceTier (over a Device),
// PinnedHostTier (memfd arenas), NvmeTier (over swap's ExtentStore).
//
// Thread-safe: every method may be called from any thread, and Read/Write on
// different slots may run concurrently. Read/Write block until the bytes have
// moved; the store calls them from its transfer threads, never under its lock.
// Allocate and Free never block on I/O.
#ifndef STRATA_TIERS_TIER_H_
#define STRATA_TIERS_TIER_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/shard_key.h"
#include "core/tier_kind.h"

namespace strata {

// A tier's handle for the space of one shard copy. Only meaningful to the tier
// that returned it.
struct TierSlot {
  uint64_t id = 0;             // the tier's own name for the slot (never 0)
  uint64_t offset_bytes = 0;   // within the tier's arena (memory tiers)
  uint64_t size_bytes = 0;     // the shard's size, as requested
  uint64_t footprint_bytes = 0;  // what the slot takes from the capacity
  bool valid() const { return id != 0; }
};

class Tier {
 public:
  virtual ~Tier() = default;

  virtual TierKind kind() const = 0;
  // "device (emulated)", "pinned_host", "nvme": for messages.
  virtual absl::string_view name() const = 0;
  virtual uint64_t capacity_bytes() const = 0;
  // Sum of footprint_bytes over allocated slots.
  virtual uint64_t used_bytes() const = 0;
  // What a slot for `size_bytes` takes from the capacity (rounded up to the
  // tier's allocation unit). Budgets are kept in these bytes.
  virtual uint64_t FootprintBytes(uint64_t size_bytes) const = 0;

  // Reserves a slot for a copy of `key` of `size_bytes` (the contents are
  // undefined until written). ResourceExhausted when it does not fit.
  virtual absl::StatusOr<TierSlot> Allocate(const ShardKey& key, uint64_t size_bytes) = 0;
  // REQUIRES: `slot` came from Allocate, and no Read/Write on it is running.
  virtual void Free(const TierSlot& slot) = 0;

  // Replaces the slot's contents with `src` (src.size() == slot.size_bytes).
  // `src` must be aligned to host_buffer_alignment().
  virtual absl::Status Write(const TierSlot& slot, absl::Span<const std::byte> src) = 0;
  // Copies the slot's contents into `dst` (dst.size() >= slot.size_bytes,
  // aligned to host_buffer_alignment()).
  virtual absl::Status Read(const TierSlot& slot, absl::Span<std::byte> dst) = 0;

  // The slot's bytes when the tier is host-addressable (pinned host), so
  // copies to and from it need no staging buffer; empty otherwise. Valid until
  // the slot is freed; aligned to 4 KiB, so usable as an O_DIRECT buffer.
  virtual absl::Span<std::byte> HostView(const TierSlot& /*slot*/) { return {}; }
  // Alignment Read/Write demand of host buffers (NVMe: the O_DIRECT rule).
  virtual uint64_t host_buffer_alignment() const { return 1; }

  // Fragmentation. In a tier whose slots are ranges of an arena (first fit),
  // free bytes are not always allocatable: Allocate can refuse a size the
  // free bytes cover when no single free range holds it. These two let the
  // TieredStore tell that case from a full tier and choose which copies to
  // drop so that a large enough range appears (eviction for contiguity).
  struct FreeSpace {
    uint64_t free_bytes = 0;
    uint64_t largest_free_range = 0;
  };
  // The free space where a slot for `key` would go (a tier of one arena per
  // job answers for key.job's arena). nullopt: the tier does not say (its
  // refusals are taken as "full").
  virtual std::optional<FreeSpace> FreeSpaceFor(const ShardKey& /*key*/) const { return std::nullopt; }
  // The length of the free range freeing `slot` would leave (its footprint
  // joined with the free ranges next to it); 0 when the tier does not say.
  virtual uint64_t FreeRangeAfterFreeing(const TierSlot& /*slot*/) const { return 0; }
};

}  // namespace strata

#endif  // STRATA_TIERS_TIER_H_
