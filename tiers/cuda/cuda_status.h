// Translation of cudaError_t into absl::Status, used only in tiers/cuda/.
#ifndef STRATA_TIERS_CUDA_CUDA_STATUS_H_
#define STRATA_TIERS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace strata {

// cudaSuccess -> OK; cudaErrorMemoryAllocation -> ResourceExhausted;
// cudaErrorNoDevice, cudaErrorInsufficientDriver -> FailedPrecondition;
// cudaErrorInvalidValue -> InvalidArgument; cudaErrorNotReady -> Unavailable;
// anything else -> Internal. The message names the context and the CUDA error.
absl::Status CudaToStatus(cudaError_t err, absl::string_view context);

}  // namespace strata

#endif  // STRATA_TIERS_CUDA_CUDA_STATUS_H_
