// DeviceSlotCopier: how the device tiers (tiers/device_tier.h, the daemon's
// per-job daemon/job_device_tier.h) move a slot between host memory and a
// device buffer: each copy on the next of a few streams (round robin, so
// transfers from several threads overlap), waited for before returning.
//
// Thread-safe.
#ifndef STRATA_TIERS_DEVICE_SLOT_COPIER_H_
#define STRATA_TIERS_DEVICE_SLOT_COPIER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tiers/device.h"
#include "tiers/tier.h"

namespace strata {

class DeviceSlotCopier {
 public:
  // Creates `streams` streams on `device` (borrowed; streams live until the
  // device is destroyed). InvalidArgument when streams < 1.
  static absl::StatusOr<std::unique_ptr<DeviceSlotCopier>> Create(Device* device, int streams);

  // Copies `src` (exactly the slot's size) into `slot` of `buffer`. `tier`
  // names the tier in errors.
  absl::Status ToDevice(DeviceBuffer buffer, const TierSlot& slot, absl::Span<const std::byte> src,
                        absl::string_view tier);
  // Copies `slot` of `buffer` into `dst` (at least the slot's size).
  absl::Status ToHost(absl::Span<std::byte> dst, DeviceBuffer buffer, const TierSlot& slot, absl::string_view tier);

 private:
  DeviceSlotCopier(Device* device, std::vector<StreamId> streams) : device_(device), streams_(std::move(streams)) {}
  StreamId NextStream();
  absl::Status Wait(StreamId stream);

  Device* const device_;
  const std::vector<StreamId> streams_;
  std::atomic<uint64_t> next_stream_{0};
};

}  // namespace strata

#endif  // STRATA_TIERS_DEVICE_SLOT_COPIER_H_
