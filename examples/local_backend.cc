#include "examples/local_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/deepspeed_config.h"
#include "core/status_macros.h"
#include "examples/partition_copy.h"

namespace strata {

absl::StatusOr<std::unique_ptr<LocalBackend>> LocalBackend::Create(
    const std::vector<ModelTensor>& tensors, ShmWorld* world, uint32_t rank,
    absl::string_view deepspeed_config_json) {
  STRATA_ASSIGN_OR_RETURN(DeepSpeedConfig config, ParseDeepSpeedConfig(deepspeed_config_json));
  if (!config.optimizer.has_value()) {
    return absl::InvalidArgumentError("local mode: the DeepSpeed config has no \"optimizer\" section");
  }
  if (config.zero.stage != 1 && config.zero.stage != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local mode: zero_optimization.stage is ", config.zero.stage, "; expected 1 or 2"));
  }
  if (config.fp16.enabled || config.bf16_enabled || config.gradient_clipping != 0) {
    return absl::InvalidArgumentError(
        "local mode runs fp32 AdamW only: disable fp16/bf16 and gradient_clipping in the config");
  }
  OptimizerHyperparams hyperparams = HyperparamsFromDeepSpeed(*config.optimizer);
  STRATA_RETURN_IF_ERROR(ValidateOptimizerHyperparams(hyperparams));

  PartitionSpec spec;
  spec.stage = config.zero.stage;
  spec.world_size = world->world_size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    spec.tensors.push_back({TensorId(static_cast<uint32_t>(i)), tensors[i].name, tensors[i].numel});
  }
  STRATA_ASSIGN_OR_RETURN(std::vector<RankLayout> layouts,
                          PartitionState(spec, StateClass::kOptimizerStates));

  const StateLayout states = StateLayoutFor(hyperparams);
  std::vector<ShardState> shards;
  for (ShardLayout& layout : layouts[rank].shards) {
    ShardState shard;
    const size_t n = layout.padded_numel;
    shard.master.assign(n, 0.0f);
    shard.grad.assign(n, 0.0f);
    if (states.exp_avg) shard.exp_avg.assign(n, 0.0f);
    if (states.exp_avg_sq) shard.exp_avg_sq.assign(n, 0.0f);
    if (states.max_exp_avg_sq) shard.max_exp_avg_sq.assign(n, 0.0f);
    shard.layout = std::move(layout);
    shards.push_back(std::move(shard));
  }
  // One thread: the kernel's results do not depend on the thread count (see
  // cpu_optimizer.h), and the example's ranks already share the CPUs.
  CpuOptimizerOptions optimizer_options;
  optimizer_options.num_threads = 1;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<CpuOptimizer> optimizer,
                          CpuOptimizer::Create(optimizer_options));
  return std::unique_ptr<LocalBackend>(new LocalBackend(
      tensors, world, rank, hyperparams, std::move(optimizer), std::move(shards)));
}

LocalBackend::LocalBackend(const std::vector<ModelTensor>& tensors, ShmWorld* world,
                           uint32_t rank, OptimizerHyperparams hyperparams,
                           std::unique_ptr<CpuOptimizer> optimizer,
                           std::vector<ShardState> shards)
    : tensors_(tensors),
      world_(world),
      rank_(rank),
      hyperparams_(hyperparams),
      optimizer_(std::move(optimizer)),
      shards_(std::move(shards)) {
  for (const ShardState& shard : shards_) {
    for (const FlatRun& run : FlatRunsOf(shard.layout.ranges, tensors_)) owned_runs_.push_back(run);
  }
}

StepSpans LocalBackend::SpansOf(ShardState& shard) {
  StepSpans spans;
  spans.size = shard.master.size();
  spans.params = shard.master.data();
  spans.exp_avg = shard.exp_avg.empty() ? nullptr : shard.exp_avg.data();
  spans.exp_avg_sq = shard.exp_avg_sq.empty() ? nullptr : shard.exp_avg_sq.data();
  spans.max_exp_avg_sq = shard.max_exp_avg_sq.empty() ? nullptr : shard.max_exp_avg_sq.data();
  spans.grad = shard.grad.data();
  spans.grad_dtype = DType::kFp32;
  return spans;
}

absl::Status LocalBackend::Init(absl::Span<const float> params) {
  for (ShardState& shard : shards_) {
    CopyFlatToShard(params, shard.layout.ranges, tensors_, absl::MakeSpan(shard.master));
    STRATA_RETURN_IF_ERROR(optimizer_->InitializeState(hyperparams_, SpansOf(shard)));
  }
  return absl::OkStatus();
}

absl::Status LocalBackend::Step(uint64_t step, absl::Span<const float> grads,
                                absl::Span<float> params) {
  for (ShardState& shard : shards_) {
    CopyFlatToShard(grads, shard.layout.ranges, tensors_, absl::MakeSpan(shard.grad));
    // torch counts optimizer steps from 1; the job's steps count from 0.
    STRATA_RETURN_IF_ERROR(optimizer_->Step(hyperparams_, static_cast<int64_t>(step) + 1,
                                            SpansOf(shard), /*grad_scale=*/1.0f));
    CopyShardToFlat(shard.master, shard.layout.ranges, tensors_, params);
  }
  const FlatRun everything{0, params.size()};
  world_->AllGather(rank_, owned_runs_, absl::MakeConstSpan(&everything, 1), params);
  return absl::OkStatus();
}

}  // namespace strata
