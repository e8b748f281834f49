// DaemonBackend: training through stratad (modes "offload" and "infinity"),
// over the client API of client/strata_client.h.
//
// Setup: rank 0 creates the job (mode, DeepSpeed config, fp32 params and
// grads so the daemon's math is the local mode's), the ranks meet at a
// barrier, then each attaches and registers the model's tensors; Init writes
// the initial params into the rank's param slots and calls InitParams, in the
// batches the daemon asks for (InitParamsInBatches).
//
// Offload (ZeRO-2): params are replicated in every rank. Step writes this
// rank's partition of the averaged gradients into the grad slots, signals
// GradReady per shard, waits for the step, copies the updated param slots
// back into the model and all-gathers across ranks.
//
// Infinity (ZeRO-3, shard index = tensor index): the rank holds no params
// between uses. FetchLayer Acquires the layer's shards, copies the param
// slots in and all-gathers the layer; ReleaseLayer Releases them and
// overwrites the layer in the model with NaN, so any use of stale params
// would show in the loss. Step is offload's without the copy back, plus an
// IterationBoundary for the prefetcher.
//
// Finish: a barrier, detach, a barrier, then rank 0 prints the daemon's
// stats if asked and deletes the job.
#ifndef STRATA_EXAMPLES_DAEMON_BACKEND_H_
#define STRATA_EXAMPLES_DAEMON_BACKEND_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "client/strata_client.h"
#include "examples/mlp.h"
#include "examples/shm_world.h"
#include "examples/train_options.h"
#include "examples/zero_backend.h"

namespace strata {

class DaemonBackend final : public ZeroBackend {
 public:
  // `model` and `world` must outlive the backend. options.mode is kOffload or
  // kInfinity. Errors of the client pass through with what was being done;
  // FailedPrecondition when the daemon's answer does not fit the model (dtype
  // not fp32, a stage other than the mode's, shard ranges that do not cover
  // the model exactly once across ranks).
  static absl::StatusOr<std::unique_ptr<DaemonBackend>> Create(const TrainOptions& options,
                                                               const Mlp& model, ShmWorld* world,
                                                               uint32_t rank);

  absl::Status Init(absl::Span<const float> params) override;
  absl::Status FetchLayer(int layer, absl::Span<float> params) override;
  absl::Status ReleaseLayer(int layer, absl::Span<float> params) override;
  absl::Status Step(uint64_t step, absl::Span<const float> grads,
                    absl::Span<float> params) override;
  absl::Status Finish() override;

 private:
  // --park_after_step: all ranks wait; rank 0 parks the job and resumes it.
  absl::Status ParkAndResume();
  DaemonBackend(const TrainOptions& options, const Mlp& model, ShmWorld* world, uint32_t rank,
                std::unique_ptr<StrataClient> client, std::unique_ptr<RankSession> session);
  // Checks the registered layout against the model and the mode.
  absl::Status CheckLayout();
  ShardView& ShardByIndex(uint32_t index);

  const TrainOptions& options_;
  const Mlp& model_;
  ShmWorld* world_;
  uint32_t rank_;
  std::unique_ptr<StrataClient> client_;
  std::unique_ptr<RankSession> session_;
  // --device_tier: the host copies of the shards FetchLayer read.
  std::deque<std::vector<float>> device_copies_;
  std::vector<FlatRun> owned_runs_;  // this rank's partition, all shards
};

}  // namespace strata

#endif  // STRATA_EXAMPLES_DAEMON_BACKEND_H_
