// Opening the daemon's CUDA device arena in a trainer (cudaIpcOpenMemHandle
// of the handle AttachRankResponse.device carries). Built with the CUDA
// runtime where strata finds the toolkit; elsewhere OpenCudaIpcArena returns
// Unimplemented and the session keeps the arena unmapped.
#ifndef STRATA_CLIENT_CUDA_IPC_H_
#define STRATA_CLIENT_CUDA_IPC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

// The base pointer of the IPC allocation `handle` (sizeof cudaIpcMemHandle_t
// bytes) on device `ordinal`, opened in this process.
absl::StatusOr<void*> OpenCudaIpcArena(const std::string& handle, int ordinal);
// Closes what OpenCudaIpcArena opened.
void CloseCudaIpcArena(void* base);
// Copies `bytes` from device memory `src` (inside an opened arena) to host
// memory `dst`, synchronously.
absl::Status CopyFromCudaArena(void* dst, const void* src, uint64_t bytes);

}  // namespace strata

#endif  // STRATA_CLIENT_CUDA_IPC_H_
