// MemoryPlanner: for a model and a cluster, how much GPU, CPU and NVMe memory
// each ZeRO strategy needs, whether it fits, and which one to use.
//
// The model-state figures are DeepSpeed's own estimators
// (estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs
// with zero_init, additional_buffer_factor 1.5 on CPU figures) generalised to
// tensor and pipeline parallelism; docs/PLANNER.md lists every formula, where
// ours departs from DeepSpeed's and why.
#ifndef STRATA_PLAN_MEMORY_PLANNER_H_
#define STRATA_PLAN_MEMORY_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/deepspeed_config.h"
#include "plan/transformer_shape.h"

namespace strata {

enum class Strategy : uint8_t {
  kDdp = 0,
  kZero1,
  kZero2,
  kZero3,
  kZero2Offload,
  kZero3OffloadOptimizer,
  kZero3OffloadAll,
  kZeroInfinity,
};
inline constexpr int kNumStrategies = 8;

// "ddp", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload_optimizer",
// "zero3_offload_all", "zero_infinity".
const char* StrategyName(Strategy strategy);

struct ClusterSpec {
  uint64_t gpus_per_node = 1;
  uint64_t nodes = 1;
  uint64_t gpu_bytes = 0;   // memory of one GPU
  uint64_t cpu_bytes = 0;   // host memory of one node
  uint64_t nvme_bytes = 0;  // NVMe of one node
  uint64_t tensor_parallel = 1;
  uint64_t pipeline_parallel = 1;
  // Held back on every GPU for the CUDA context, NCCL and allocator slack.
  uint64_t gpu_reserve_bytes = 1ull << 30;
};

struct ModelSpec {
  uint64_t params = 0;
  uint64_t largest_layer_params = 0;        // 0: estimated from params
  std::optional<TransformerShape> shape;    // gives activations when set
  bool activation_checkpointing = true;     // which activation figure counts
};

// Per-strategy buffer sizes that come from a DeepSpeed config (defaults as
// DeepSpeed's).
struct OffloadBuffers {
  uint64_t param_buffer_count = 5;
  uint64_t param_buffer_elements = 100'000'000;
  // strata stages optimizer state through pinned tiles, not whole sub-groups.
  uint64_t optimizer_staging_bytes = 1ull << 30;
};

enum class Tier : uint8_t { kNone, kGpu, kCpu, kNvme };
const char* TierName(Tier tier);  // "gpu", "cpu", "nvme"

struct StrategyEstimate {
  Strategy strategy;
  uint64_t gpu_bytes = 0;        // per GPU: model states + activations + reserve
  uint64_t gpu_model_states = 0; // per GPU: DeepSpeed's model-state figure
  uint64_t cpu_bytes = 0;        // per node
  uint64_t nvme_bytes = 0;       // per node
  uint64_t pcie_bytes_per_step = 0;  // per GPU, both directions
  uint64_t nvme_read_bytes_per_step = 0;   // per node
  uint64_t nvme_write_bytes_per_step = 0;  // per node
  bool fits = false;
  Tier overflow = Tier::kNone;  // the first tier that does not fit
};

struct Plan {
  uint64_t params = 0;
  uint64_t largest_layer_params = 0;
  uint64_t data_parallel = 1;
  uint64_t activation_bytes = 0;           // the figure counted in gpu_bytes
  uint64_t activation_bytes_no_ckpt = 0;   // 0 when no shape was given
  uint64_t activation_bytes_ckpt = 0;
  std::vector<StrategyEstimate> strategies;  // in Strategy order, fastest first
  std::optional<Strategy> recommended;
  std::string reason;  // one sentence
};

// InvalidArgument naming the flag (--params, --gpus-per-node, --tp, ...) for
// impossible inputs: zero sizes, tp*pp not dividing the GPU count.
absl::StatusOr<Plan> MakePlan(const ModelSpec& model, const ClusterSpec& cluster,
                              const OffloadBuffers& buffers);

// The strategy a DeepSpeed config selects (stage + offload devices).
Strategy StrategyForConfig(const DeepSpeedConfig& config);

}  // namespace strata

#endif  // STRATA_PLAN_MEMORY_PLANNER_H_
