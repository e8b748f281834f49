#include "tiers/device_slot_copier.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<DeviceSlotCopier>> DeviceSlotCopier::Create(Device* device, int streams) {
  if (streams < 1) return absl::InvalidArgumentError("device tier: streams must be >= 1");
  std::vector<StreamId> ids;
  for (int i = 0; i < streams; ++i) {
    STRATA_ASSIGN_OR_RETURN(StreamId s, device->CreateStream());
    ids.push_back(s);
  }
  return std::unique_ptr<DeviceSlotCopier>(new DeviceSlotCopier(device, std::move(ids)));
}

StreamId DeviceSlotCopier::NextStream() {
  return streams_[next_stream_.fetch_add(1, std::memory_order_relaxed) % streams_.size()];
}

absl::Status DeviceSlotCopier::Wait(StreamId stream) {
  STRATA_ASSIGN_OR_RETURN(EventId done, device_->RecordEvent(stream));
  return device_->WaitEvent(done);
}

absl::Status DeviceSlotCopier::ToDevice(DeviceBuffer buffer, const TierSlot& slot, absl::Span<const std::byte> src,
                                        absl::string_view tier) {
  if (src.size() != slot.size_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(tier, ": writing ", src.size(), " bytes into a slot of ", slot.size_bytes));
  }
  const StreamId stream = NextStream();
  STRATA_RETURN_IF_ERROR(device_->CopyToDevice(buffer, slot.offset_bytes, src.data(), src.size(), stream));
  return Wait(stream);
}

absl::Status DeviceSlotCopier::ToHost(absl::Span<std::byte> dst, DeviceBuffer buffer, const TierSlot& slot,
                                      absl::string_view tier) {
  if (dst.size() < slot.size_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(tier, ": reading a slot of ", slot.size_bytes, " bytes into ", dst.size()));
  }
  const StreamId stream = NextStream();
  STRATA_RETURN_IF_ERROR(device_->CopyToHost(dst.data(), buffer, slot.offset_bytes, slot.size_bytes, stream));
  return Wait(stream);
}

}  // namespace strata
