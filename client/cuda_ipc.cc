#include "client/cuda_ipc.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata {

absl::StatusOr<void*> OpenCudaIpcArena(const std::string& handle, int ordinal) {
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h)) {
    return absl::InvalidArgumentError(absl::StrCat("the daemon's CUDA IPC handle is ", handle.size(),
                                                   " bytes; this CUDA runtime's is ", sizeof(h)));
  }
  std::memcpy(&h, handle.data(), sizeof(h));
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("cudaSetDevice(", ordinal, "): ", cudaGetErrorString(e)));
  }
  void* base = nullptr;
  if (cudaError_t e = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudaIpcOpenMemHandle of the daemon's device arena: ", cudaGetErrorString(e)));
  }
  return base;
}

absl::Status CopyFromCudaArena(void* dst, const void* src, uint64_t bytes) {
  if (cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaMemcpy from the device arena: ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

void CloseCudaIpcArena(void* base) {
  if (base != nullptr) (void)cudaIpcCloseMemHandle(base);
}

}  // namespace strata
