// ZeroBackend: where a rank's params come from and who runs its optimizer --
// the one thing that differs between the example's three training modes.
//
//   local     (LocalBackend)   the rank holds fp32 masters and AdamW states of
//                              its ZeRO-2 partition and steps them itself,
//                              with the daemon's CPU optimizer kernel.
//   offload   (DaemonBackend)  ZeRO-Offload: the daemon holds them and steps.
//   infinity  (DaemonBackend)  ZeRO-Infinity: stage 3, params too live in the
//                              daemon (on NVMe); a layer's params are fetched
//                              before it runs and dropped after.
//
// The training loop (train_rank.h) is the same for all three: for each layer,
// FetchLayer, compute, ReleaseLayer (forward, then backward in reverse);
// average the gradients over ranks; Step.
#ifndef STRATA_EXAMPLES_ZERO_BACKEND_H_
#define STRATA_EXAMPLES_ZERO_BACKEND_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace strata {

class ZeroBackend {
 public:
  virtual ~ZeroBackend() = default;

  // `params` is the full initial model (flat, as Mlp lays it out), the same
  // on every rank.
  virtual absl::Status Init(absl::Span<const float> params) = 0;

  // Before layer `layer` runs, forward or backward: on return its tensors in
  // `params` hold their current full values.
  virtual absl::Status FetchLayer(int layer, absl::Span<float> params) = 0;
  // After the layer ran; a stage 3 backend drops the layer's params.
  virtual absl::Status ReleaseLayer(int layer, absl::Span<float> params) = 0;

  // Applies optimizer step `step` (0-based) to this rank's partition, given
  // `grads`, the gradients averaged over ranks (the same on every rank). On
  // return, `params` holds the updated model wherever FetchLayer will not
  // bring it (for local and offload: everywhere).
  virtual absl::Status Step(uint64_t step, absl::Span<const float> grads,
                            absl::Span<float> params) = 0;

  // After the last step, on every rank.
  virtual absl::Status Finish() = 0;
};

}  // namespace strata

#endif  // STRATA_EXAMPLES_ZERO_BACKEND_H_
