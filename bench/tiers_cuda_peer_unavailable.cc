#include "absl/status/status.h"
#include "bench/tiers_cuda_peer.h"

namespace strata {

absl::StatusOr<CudaMemcpyPeerResult> MeasureCudaMemcpyPeer(uint64_t, uint64_t, int) {
  return absl::UnimplementedError("built without the CUDA toolkit: no cudaMemcpy peer");
}

}  // namespace strata
