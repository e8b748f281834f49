// DeviceArena: the daemon's device tier -- virtual GPU memory it manages for
// its jobs. It owns the Device (CudaDevice through tiers/cuda_device_factory.h,
// or an EmulatedDevice whose memory is one memfd) and a DeviceTier of
// --device_capacity over it: one arena buffer, sub-allocated into shard slots.
// A slot's offset (TierSlot::offset_bytes, ShardPlace::offset) is its offset
// in that arena, so a trainer that mapped the arena once per session reads an
// acquired shard at `arena + offset`.
//
// How the arena is shared (share()):
//   emulated: the arena's memfd, handed over the fd socket (daemon/fd_handoff.h)
//             as a read-only descriptor;
//   cuda:     the cudaIpcMemHandle_t of the arena's allocation and the arena's
//             offset in it, in AttachRankResponse.device.
//
// --device auto picks CUDA when the driver reports a device and the emulated
// device otherwise (the startup log says which and why): the emulated arena's
// pages exist only once shards are stored in it, so it costs nothing unused.
// --device none: no device tier; jobs asking for a device budget are refused.
//
// Thread-safe (the tier is; the rest is immutable after Create).
#ifndef STRATA_DAEMON_DEVICE_ARENA_H_
#define STRATA_DAEMON_DEVICE_ARENA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/unix_socket.h"
#include "daemon/daemon_config.h"
#include "tiers/device.h"
#include "tiers/device_tier.h"

namespace strata {

class DeviceArena {
 public:
  // nullptr (and a line in `choices`) for DeviceChoice::kNone. Errors: cuda
  // requested without a usable GPU (FailedPrecondition naming the driver's
  // answer), a capacity the device cannot give (ResourceExhausted), a
  // capacity that is 0 or not a multiple of 4 KiB (InvalidArgument naming
  // --device_capacity).
  static absl::StatusOr<std::unique_ptr<DeviceArena>> Create(DeviceChoice choice, uint64_t capacity_bytes,
                                                             std::vector<std::string>* choices);
  ~DeviceArena();

  Tier* tier() const { return tier_.get(); }
  uint64_t capacity_bytes() const { return tier_->capacity_bytes(); }
  uint64_t used_bytes() const { return tier_->used_bytes(); }
  const std::string& device_name() const { return device_->info().name; }
  // How a trainer maps the arena (see the header comment).
  const DeviceExport& share() const { return share_; }
  // Emulated: a read-only descriptor of the arena's memfd for the fd
  // socket (the trainer reads shards; only the daemon writes them); -1 for
  // CUDA. Owned by the arena.
  int read_only_fd() const { return read_only_fd_.get(); }

 private:
  DeviceArena() = default;
  // Declared so the tier is destroyed (its arena freed) before the device.
  std::unique_ptr<Device> device_;
  std::unique_ptr<DeviceTier> tier_;
  DeviceExport share_;
  UniqueFd read_only_fd_;
};

}  // namespace strata

#endif  // STRATA_DAEMON_DEVICE_ARENA_H_
