// MemoryPlanner: for a model and a cluster, how much GPU, CPU and NVMe memory
// each ZeRO strategy needs, whether it fits, and which one to use.
//
// Model states per GPU follow the ZeRO paper (Rajbhandari et al. 2020,
// mixed-precision Adam, K = 12): DDP 16P, ZeRO-1 4P + 12P/N, ZeRO-2
// 2P + 14P/N, ZeRO-3 16P/N. On top of them each strategy counts the buffers
// DeepSpeed's runtime (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py,
// partitioned_param_coordinator.py) really allocates, sized from the DeepSpeed
// config when one is given. docs/PLANNER.md lists every formula, the source
// line each buffer comes from, and where this departs from DeepSpeed's
// estimate_zero2/3_model_states_mem_needs and why.
#ifndef STRATA_PLAN_MEMORY_PLANNER_H_
#define STRATA_PLAN_MEMORY_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
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

// The runtime's buffer sizes, in elements unless named _bytes. Defaults are
// DeepSpeed's (0.19 zero/config.py, engine.py); BuffersFromConfig takes them
// from a DeepSpeed config.
struct ZeroBuffers {
  // zero_optimization.reduce_bucket_size: the gradient bucket (ipg buffer),
  // 16-bit, at stages 1-3 when contiguous_gradients is on.
  uint64_t reduce_bucket_size = 500'000'000;
  bool contiguous_gradients = true;
  // overlap_comm at stage 1/2 gives the bucket a second buffer
  // (stage_1_and_2.py setup_buckets). DeepSpeed's default there is false;
  // stage 3 has one bucket buffer whatever overlap_comm says.
  bool overlap_comm_stage12 = false;
  // Stage 0: the engine flattens gradients in all-reduce buckets of
  // MEMORY_OPT_ALLREDUCE_SIZE elements (engine.py allreduce_gradients).
  uint64_t allreduce_bucket_size = 500'000'000;
  // Stage 3: the fp32 gradient buffer is one sub-group long.
  uint64_t sub_group_size = 1'000'000'000;
  uint64_t stage3_prefetch_bucket_size = 50'000'000;
  uint64_t stage3_max_live_parameters = 1'000'000'000;
  uint64_t stage3_param_persistence_threshold = 100'000;
  // ZeRO-Infinity (strata's own pipeline): pinned param buffers
  // (offload_param.buffer_count x buffer_size) and optimizer staging; strata
  // stages optimizer state through pinned tiles, not whole sub-groups.
  uint64_t param_buffer_count = 5;
  uint64_t param_buffer_elements = 100'000'000;
  uint64_t optimizer_staging_bytes = 1ull << 30;
};

// The buffer sizes a DeepSpeed config asks for (its defaults where unset).
ZeroBuffers BuffersFromConfig(const DeepSpeedConfig& config);

// The tensor-parallel degree: --tp when given (tp_flag_given), else the
// config's tensor_parallel.autotp_size when set (> 0), else the cluster's.
// InvalidArgument when both are given and differ.
absl::Status ApplyConfigTensorParallel(const DeepSpeedConfig& config, bool tp_flag_given,
                                       ClusterSpec* cluster);

enum class Tier : uint8_t { kNone, kGpu, kCpu, kNvme };
const char* TierName(Tier tier);  // "gpu", "cpu", "nvme"

// Per GPU, the runtime buffers on top of the model states (bytes). Which of
// them a strategy holds, and why, is in docs/PLANNER.md.
struct GpuBuffers {
  uint64_t reduce_buckets = 0;      // gradient bucket(s); stage 0: all-reduce flatten buffer
  uint64_t fp32_gradients = 0;      // fp32 gradient the optimizer step reads
  uint64_t gathered_params = 0;     // stage 3: whole 16-bit params (module in use + prefetch)
  uint64_t module_gradient = 0;     // 16-bit gradient of the largest module before bucketing
  uint64_t persistent_params = 0;   // stage 3: small params kept whole on every GPU
  uint64_t offload_staging = 0;     // stage 1/2 offload: temp gradient buffer on the GPU
  uint64_t Total() const {
    return reduce_buckets + fp32_gradients + gathered_params + module_gradient + persistent_params +
           offload_staging;
  }
};

struct StrategyEstimate {
  Strategy strategy;
  uint64_t gpu_bytes = 0;        // per GPU: model states + buffers + activations + reserve
  uint64_t gpu_model_states = 0; // per GPU: the ZeRO paper's model states on the GPU
  GpuBuffers gpu_buffers;        // per GPU: what DeepSpeed's runtime adds
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
  uint64_t persistent_params = 0;          // stage-3 params kept whole (per threshold)
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
                              const ZeroBuffers& buffers);

// The strategy a DeepSpeed config selects (stage + offload devices).
Strategy StrategyForConfig(const DeepSpeedConfig& config);

}  // namespace strata

#endif  // STRATA_PLAN_MEMORY_PLANNER_H_
