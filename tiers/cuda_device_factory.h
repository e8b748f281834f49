// The factory for the CUDA device. This header is the only way code outside
// tiers/cuda/ reaches CUDA: it names no CUDA type, and where strata was built
// without the CUDA toolkit NewCudaDevice returns Unimplemented so the
// composition root can fall back to the emulated device.
#ifndef STRATA_TIERS_CUDA_DEVICE_FACTORY_H_
#define STRATA_TIERS_CUDA_DEVICE_FACTORY_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "tiers/device.h"

namespace strata {

struct CudaDeviceOptions {
  int device_ordinal = 0;
  // One cudaMalloc of this size at creation; Allocate sub-allocates from it so
  // steady state never calls cudaMalloc/cudaFree (both synchronize the device).
  uint64_t arena_bytes = 256ull << 20;
  // arena_bytes 0: no shared arena; each Allocate is its own cudaMalloc (and
  // Export its own IPC handle, which opens that buffer and nothing else),
  // bounded by capacity_bytes (> 0). For a daemon that shares one buffer per
  // job with that job's trainers only (daemon/job_device_tier.h).
  uint64_t capacity_bytes = 0;
};

// Unimplemented when built without CUDA; FailedPrecondition when the driver
// reports no device (the message carries cudaGetDeviceCount's error);
// ResourceExhausted when the arena does not fit.
absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(const CudaDeviceOptions& options);

// Number of CUDA devices visible, or the reason there are none usable
// (Unimplemented without CUDA, FailedPrecondition from the driver).
absl::StatusOr<int> CudaDeviceCount();

}  // namespace strata

#endif  // STRATA_TIERS_CUDA_DEVICE_FACTORY_H_
