// OpenCudaIpcArena where strata was built without the CUDA toolkit.
#include "client/cuda_ipc.h"

namespace strata {

absl::StatusOr<void*> OpenCudaIpcArena(const std::string&, int) {
  return absl::UnimplementedError(
      "the daemon shares a CUDA device arena, but this client was built without the CUDA toolkit");
}

void CloseCudaIpcArena(void*) {}

absl::Status CopyFromCudaArena(void*, const void*, uint64_t) {
  return absl::UnimplementedError("this client was built without the CUDA toolkit");
}

}  // namespace strata
