// TrainRank: the training loop of one data-parallel rank, the same in every
// mode; the mode lives in the ZeroBackend it is given.
//
// Per step: the rank's own synthetic batch; forward layer by layer
// (FetchLayer, compute, ReleaseLayer), the loss, backward layer by layer in
// reverse; the gradients and the loss averaged over ranks (ShmWorld, rank
// order: deterministic); rank 0 prints "step <n> loss <x>"; then the backend
// applies the optimizer step. The printed loss is the mean of the ranks'
// batch losses before that step's update.
#ifndef STRATA_EXAMPLES_TRAIN_RANK_H_
#define STRATA_EXAMPLES_TRAIN_RANK_H_

#include <cstdint>
#include <cstdio>

#include "absl/status/status.h"
#include "examples/mlp.h"
#include "examples/shm_world.h"
#include "examples/train_options.h"
#include "examples/zero_backend.h"

namespace strata {

// `model` is freshly constructed from options.widths; `backend` is built over
// its tensors. Rank 0 writes its step lines to `out` and flushes each.
// Returns the first error of the backend, naming the step.
absl::Status TrainRank(const TrainOptions& options, ShmWorld* world, uint32_t rank, Mlp* model,
                       ZeroBackend* backend, std::FILE* out);

}  // namespace strata

#endif  // STRATA_EXAMPLES_TRAIN_RANK_H_
