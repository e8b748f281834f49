#include "client/cuda_ipc.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata {

namespace {

// Makes `ordinal` the calling thread's current device for one scope and puts
// the caller's back when it ends, on every return path: the arena is opened
// on the daemon's device, but the trainer's thread (PyTorch's, whose current
// device is its own choice) must run its next kernels where it ran them.
class ScopedCudaDevice {
 public:
  ScopedCudaDevice() = default;
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;
  // Errors cannot be reported here; a failed restore leaves what cudaSetDevice left.
  ~ScopedCudaDevice() {
    if (saved_ >= 0) (void)cudaSetDevice(saved_);
  }

  absl::Status Switch(int ordinal) {
    int current = 0;
    if (cudaError_t e = cudaGetDevice(&current); e != cudaSuccess) {
      return absl::FailedPreconditionError(absl::StrCat("cudaGetDevice: ", cudaGetErrorString(e)));
    }
    // Saved before switching: a cudaSetDevice that fails is undone too.
    saved_ = current;
    if (current == ordinal) return absl::OkStatus();
    if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
      return absl::FailedPreconditionError(absl::StrCat("cudaSetDevice(", ordinal, "): ", cudaGetErrorString(e)));
    }
    return absl::OkStatus();
  }

 private:
  int saved_ = -1;  // -1: nothing to restore
};

}  // namespace

absl::StatusOr<void*> OpenCudaIpcArena(const std::string& handle, int ordinal) {
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h)) {
    return absl::InvalidArgumentError(absl::StrCat("the daemon's CUDA IPC handle is ", handle.size(),
                                                   " bytes; this CUDA runtime's is ", sizeof(h)));
  }
  std::memcpy(&h, handle.data(), sizeof(h));
  ScopedCudaDevice device;
  if (absl::Status s = device.Switch(ordinal); !s.ok()) return s;
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
  if (base == nullptr) return;
  // Closed on the device it was opened on (OpenCudaIpcArena no longer leaves
  // that one current), and the caller's device put back after.
  ScopedCudaDevice device;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, base) == cudaSuccess && attributes.device >= 0) {
    (void)device.Switch(attributes.device);
  }
  (void)cudaIpcCloseMemHandle(base);
}

}  // namespace strata
