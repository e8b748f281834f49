// DeviceArena: the daemon's device tier -- virtual GPU memory it manages for
// its jobs. It owns the Device (CudaDevice through tiers/cuda_device_factory.h,
// or an EmulatedDevice whose allocations are memfds) and a JobDeviceTier of
// --device_capacity over it (daemon/job_device_tier.h): one arena per job
// with a device budget, exactly that budget (rounded up to the slot
// alignment; the device holds --device_capacity and no headroom), carved
// when the job is created or restored and freed when it is deleted,
// sub-allocated into that job's shard slots. A slot's
// offset (TierSlot::offset_bytes, ShardPlace::offset) is its offset in its
// job's arena, so a trainer that mapped its job's arena once per session
// reads an acquired shard at `arena + offset` -- and can map no other job's.
// A new arena holds only zeros, never a retired job's bytes: an emulated one
// is a fresh memfd, a CUDA one is zeroed by CudaDevice::Allocate.
//
// How a job's arena is shared (tier()->Share(job)):
//   emulated: the job's memfd, handed over the fd socket (daemon/fd_handoff.h)
//             as a read-only descriptor;
//   cuda:     the cudaIpcMemHandle_t of the job's own cudaMalloc allocation
//             (offset 0), in AttachRankResponse.device.
//
// --device auto picks CUDA when the driver reports a device and the emulated
// device otherwise (the startup log says which and why): an emulated arena's
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
#include "daemon/daemon_config.h"
#include "daemon/job_device_tier.h"
#include "tiers/device.h"

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

  JobDeviceTier* tier() const { return tier_.get(); }
  uint64_t capacity_bytes() const { return tier_->capacity_bytes(); }
  uint64_t used_bytes() const { return tier_->used_bytes(); }
  const std::string& device_name() const { return device_->info().name; }

 private:
  DeviceArena() = default;
  // Declared so the tier is destroyed (its arena freed) before the device.
  std::unique_ptr<Device> device_;
  std::unique_ptr<JobDeviceTier> tier_;
};

}  // namespace strata

#endif  // STRATA_DAEMON_DEVICE_ARENA_H_
