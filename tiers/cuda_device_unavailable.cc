// NewCudaDevice where strata was built without the CUDA toolkit.
#include "absl/status/status.h"
#include "tiers/cuda_device_factory.h"

namespace strata {

absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(const CudaDeviceOptions&) {
  return absl::UnimplementedError(
      "CUDA device: strata was built without the CUDA toolkit (configure with "
      "/usr/local/cuda present and -DSTRATA_ENABLE_CUDA=ON)");
}

absl::StatusOr<int> CudaDeviceCount() {
  return absl::UnimplementedError("CUDA device: strata was built without the CUDA toolkit");
}

}  // namespace strata
