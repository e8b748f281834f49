#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench/tiers_cuda_peer.h"

namespace strata {
namespace {

absl::Status Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

}  // namespace

absl::StatusOr<CudaMemcpyPeerResult> MeasureCudaMemcpyPeer(uint64_t total_bytes, uint64_t chunk_bytes,
                                                           int rounds) {
  if (chunk_bytes == 0 || total_bytes < chunk_bytes || rounds < 1) {
    return absl::InvalidArgumentError("cudaMemcpy peer: need 0 < chunk <= total and rounds >= 1");
  }
  int count = 0;
  if (absl::Status s = Check(cudaGetDeviceCount(&count), "cudaGetDeviceCount"); !s.ok()) return s;
  if (count == 0) return absl::FailedPreconditionError("cudaMemcpy peer: no CUDA device");
  void* host = nullptr;
  void* device = nullptr;
  cudaStream_t stream = nullptr;
  CudaMemcpyPeerResult best;
  absl::Status status = Check(cudaHostAlloc(&host, total_bytes, cudaHostAllocDefault), "cudaHostAlloc");
  if (status.ok()) status = Check(cudaMalloc(&device, total_bytes), "cudaMalloc");
  if (status.ok()) status = Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  if (status.ok()) status = Check(cudaMemset(device, 0, total_bytes), "cudaMemset");
  for (int round = 0; status.ok() && round < rounds; ++round) {
    for (int direction = 0; direction < 2 && status.ok(); ++direction) {
      const auto start = std::chrono::steady_clock::now();
      for (uint64_t off = 0; off < total_bytes && status.ok(); off += chunk_bytes) {
        const uint64_t n = std::min(chunk_bytes, total_bytes - off);
        char* h = static_cast<char*>(host) + off;
        char* d = static_cast<char*>(device) + off;
        status = direction == 0 ? Check(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, stream), "H2D")
                                : Check(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, stream), "D2H");
      }
      if (status.ok()) status = Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double gbps = static_cast<double>(total_bytes) / s / 1e9;
      double& slot = direction == 0 ? best.h2d_gbps : best.d2h_gbps;
      slot = std::max(slot, gbps);
    }
  }
  if (stream != nullptr) cudaStreamDestroy(stream);
  if (device != nullptr) cudaFree(device);
  if (host != nullptr) cudaFreeHost(host);
  if (!status.ok()) return status;
  return best;
}

}  // namespace strata
