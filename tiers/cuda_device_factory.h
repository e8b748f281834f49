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
