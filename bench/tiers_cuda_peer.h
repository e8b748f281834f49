// The peer `strata bench tiers` holds the device tier against on a GPU: the
// CUDA runtime's own cudaMemcpyAsync between cudaHostAlloc'd memory and a
// cudaMalloc'd buffer, the best a hand-written trainer gets. Built from
// tiers_cuda_peer.cc where the CUDA toolkit is found, else from
// tiers_cuda_peer_unavailable.cc (Unimplemented).
#ifndef STRATA_BENCH_TIERS_CUDA_PEER_H_
#define STRATA_BENCH_TIERS_CUDA_PEER_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace strata {

struct CudaMemcpyPeerResult {
  double h2d_gbps = 0;  // 10^9 bytes/s
  double d2h_gbps = 0;
};

// Copies `total_bytes` in `chunk_bytes` pieces each way, `rounds` times, and
// returns the best round. FailedPrecondition when no GPU answers.
absl::StatusOr<CudaMemcpyPeerResult> MeasureCudaMemcpyPeer(uint64_t total_bytes, uint64_t chunk_bytes,
                                                           int rounds);

}  // namespace strata

#endif  // STRATA_BENCH_TIERS_CUDA_PEER_H_
