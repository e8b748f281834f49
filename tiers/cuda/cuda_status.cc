#include "tiers/cuda/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace strata {

absl::Status CudaToStatus(cudaError_t err, absl::string_view context) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string message =
      absl::StrCat(context, ": ", cudaGetErrorString(err), " (", cudaGetErrorName(err), ")");
  switch (err) {
    case cudaErrorMemoryAllocation: return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver: return absl::FailedPreconditionError(message);
    case cudaErrorInvalidValue: return absl::InvalidArgumentError(message);
    case cudaErrorNotReady: return absl::UnavailableError(message);
    default: return absl::InternalError(message);
  }
}

}  // namespace strata
