// LocalBackend: training without the daemon (mode "local"). Each rank keeps
// the fp32 master params and AdamW states of its own ZeRO partition and steps
// them in-process with strata's CPU optimizer -- the same kernel the daemon
// runs -- over the same layout the daemon would use (core's PartitionState at
// the config's stage, 1 or 2: one flat shard per rank). After the step the
// ranks all-gather the updated params.
//
// This is the baseline the daemon modes must match bit for bit.
#ifndef STRATA_EXAMPLES_LOCAL_BACKEND_H_
#define STRATA_EXAMPLES_LOCAL_BACKEND_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/zero_partition.h"
#include "examples/mlp.h"
#include "examples/shm_world.h"
#include "examples/zero_backend.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "optimizer_cpu/hyperparams.h"

namespace strata {

class LocalBackend final : public ZeroBackend {
 public:
  // `tensors` and `world` must outlive the backend. InvalidArgument when the
  // DeepSpeed config does not parse, has no optimizer, is not stage 1 or 2,
  // or asks for fp16/bf16 or gradient clipping (which only the daemon's step
  // pipeline implements).
  static absl::StatusOr<std::unique_ptr<LocalBackend>> Create(
      const std::vector<ModelTensor>& tensors, ShmWorld* world, uint32_t rank,
      absl::string_view deepspeed_config_json);

  absl::Status Init(absl::Span<const float> params) override;
  absl::Status FetchLayer(int, absl::Span<float>) override { return absl::OkStatus(); }
  absl::Status ReleaseLayer(int, absl::Span<float>) override { return absl::OkStatus(); }
  absl::Status Step(uint64_t step, absl::Span<const float> grads,
                    absl::Span<float> params) override;
  absl::Status Finish() override { return absl::OkStatus(); }

 private:
  struct ShardState {
    ShardLayout layout;
    std::vector<float> master;
    std::vector<float> exp_avg;
    std::vector<float> exp_avg_sq;
    std::vector<float> max_exp_avg_sq;
    std::vector<float> grad;
  };

  LocalBackend(const std::vector<ModelTensor>& tensors, ShmWorld* world, uint32_t rank,
               OptimizerHyperparams hyperparams, std::unique_ptr<CpuOptimizer> optimizer,
               std::vector<ShardState> shards);
  StepSpans SpansOf(ShardState& shard);

  const std::vector<ModelTensor>& tensors_;
  ShmWorld* world_;
  uint32_t rank_;
  OptimizerHyperparams hyperparams_;
  std::unique_ptr<CpuOptimizer> optimizer_;
  std::vector<ShardState> shards_;
  std::vector<FlatRun> owned_runs_;  // this rank's partition in the flat model
};

}  // namespace strata

#endif  // STRATA_EXAMPLES_LOCAL_BACKEND_H_
