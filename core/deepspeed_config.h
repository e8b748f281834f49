// DeepSpeedConfig: the parts of a DeepSpeed JSON config that strata acts on,
// read exactly as DeepSpeed 0.19.8 reads them, so users keep the file they have.
//
// What "exactly" means (checked against DeepSpeed's own parser by
// tests/deepspeed_conformance; the differences that remain, each with its
// reason, are listed in docs/DEEPSPEED_CONFIG.md):
// - the sections DeepSpeed reads with its pydantic models (zero_optimization,
//   offload_param, offload_optimizer, fp16, bf16/bfloat16, tensor_parallel)
//   are read with pydantic's rules: an unknown key there is an error, values
//   are coerced as pydantic coerces them ("true", 1, "5" ...), "auto" means
//   "DeepSpeed's default", aliases (stage3_prefetch_bucket_size ==
//   prefetch_bucket_size, ...) and deprecated keys (cpu_offload,
//   cpu_offload_param, "zero_optimization": true) map as DeepSpeed maps them;
// - keys DeepSpeed has removed (progressive_layer_drop, sparse_attention,
//   curriculum_learning, ...) are refused with DeepSpeed's message;
// - an unknown top-level key, which DeepSpeed ignores, is a warning;
// - settings DeepSpeed ignores for the stage in use (offload_param below
//   stage 3, offload_optimizer at stage 0) are a warning and read as "none";
//   offload_optimizer.device "nvme" below stage 3 runs as CPU offload in
//   DeepSpeed, and is recorded so (device kCpu, nvme_ran_as_cpu);
// - an invalid value is InvalidArgument naming the key path and what is
//   allowed; a value DeepSpeed's parser leaves to its engine (optimizer
//   params) is recorded as unusable for stratad, not refused.
// The reader never crashes: nesting is capped before the JSON is built, and
// nothing on an error path walks a value recursively.
#ifndef STRATA_CORE_DEEPSPEED_CONFIG_H_
#define STRATA_CORE_DEEPSPEED_CONFIG_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata {

enum class OffloadDevice : uint8_t { kNone = 0, kCpu = 1, kNvme = 2 };
absl::string_view OffloadDeviceName(OffloadDevice device);

// The optimizers stratad may run; any other name DeepSpeed accepts (a
// DeepSpeed optimizer such as OneBitAdam or MuSGD, or a torch.optim class)
// is kOther, its name in OptimizerConfig::type: `strata plan` plans it and
// CreateJob refuses it.
enum class OptimizerKind : uint8_t {
  kAdam = 0,
  kAdamW = 1,
  kAdagrad = 2,
  kLion = 3,
  kLamb = 4,
  kOther = 5,
};
absl::string_view OptimizerKindName(OptimizerKind kind);

// DeepSpeed's defaults are given beside each field.
struct OffloadOptimizerConfig {
  // What DeepSpeed runs: "nvme" below stage 3 runs as CPU offload, and any
  // offload at stage 0 is ignored (kNone); see nvme_ran_as_cpu / ignored.
  OffloadDevice device = OffloadDevice::kNone;  // "none"
  std::string nvme_path;                        // may be empty even for nvme
  bool pin_memory = true;
  uint32_t buffer_count = 4;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;  // fraction of optimizer states offloaded, [0, 1]; < 1 needs stage 3
  bool super_offload = false;
  double cpuadam_cores_perc = 0.8;
  bool nvme_ran_as_cpu = false;  // the config said "nvme" at stage 1/2
  bool ignored = false;          // the config asked for offload at stage 0
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;  // kNone when ignored below stage 3
  std::string nvme_path;
  uint32_t buffer_count = 5;
  uint64_t buffer_size = 100'000'000;    // elements
  uint64_t max_in_cpu = 1'000'000'000;   // elements
  bool pin_memory = true;
  bool ignored = false;  // the config asked for param offload below stage 3
};

struct ZeroConfig {
  int stage = 0;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  uint64_t sub_group_size = 1'000'000'000;                 // >= 0
  uint64_t stage3_prefetch_bucket_size = 50'000'000;       // alias prefetch_bucket_size
  bool stage3_prefetch_bucket_size_auto = false;
  uint64_t stage3_max_live_parameters = 1'000'000'000;     // alias max_live_parameters
  uint64_t stage3_max_reuse_distance = 1'000'000'000;      // alias max_reuse_distance
  uint64_t stage3_param_persistence_threshold = 100'000;   // alias param_persistence_threshold
  bool stage3_param_persistence_threshold_auto = false;
  uint64_t stage3_model_persistence_threshold = INT64_MAX; // sys.maxsize
  bool gather_16bit_weights_on_model_save = false;
  bool overlap_comm = false;  // DeepSpeed: true by default at stage 3
  bool contiguous_gradients = true;
  uint64_t reduce_bucket_size = 500'000'000;  // > 0
  bool reduce_bucket_size_auto = false;
  bool reduce_scatter = true;
  bool allgather_partitions = true;
  uint64_t allgather_bucket_size = 500'000'000;  // >= 0
  bool round_robin_gradients = false;
  uint64_t zero_hpz_partition_size = 1;
  bool compute_grad_norm = true;  // false needs stage 1 or 2
};

struct AioConfig {
  uint64_t block_size = 1'048'576;
  uint32_t queue_depth = 8;
  uint32_t intra_op_parallelism = 1;  // old name: thread_count
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

struct LossScaleConfig {
  bool enabled = false;
  double loss_scale = 0;  // 0 = dynamic loss scaling
  int initial_scale_power = 16;
  uint32_t loss_scale_window = 1000;
  uint32_t hysteresis = 2;
  double min_loss_scale = 1;  // DeepSpeed reads it as an int
  bool consecutive_hysteresis = false;
  bool auto_cast = false;
  bool fp16_master_weights_and_grads = false;
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  // The "type" as written ("OneBitAdam", "SGD", "adamw", ...).
  std::string type;
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  // Adagrad only.
  double lr_decay = 0;
  double initial_accumulator_value = 0;
  // Which values were "auto" (filled from defaults).
  bool lr_auto = false;
  // DeepSpeed's parser hands optimizer params to the optimizer's constructor
  // unchecked; a value stratad cannot use (a string lr, three betas) is
  // recorded here and CreateJob refuses it, while `strata plan` still plans.
  std::vector<std::string> unusable;
};

// DeepSpeed 0.19.8's GRADIENT_CLIPPING_DEFAULT.
inline constexpr double kDeepSpeedDefaultGradientClipping = 1.0;

struct DeepSpeedConfig {
  ZeroConfig zero;
  AioConfig aio;
  LossScaleConfig fp16;
  bool bf16_enabled = false;  // "bf16", or its old name "bfloat16"
  std::optional<OptimizerConfig> optimizer;  // absent: the trainer brings its own
  // The config's gradient_clipping; <= 0 = off. Absent or "auto" reads as
  // DeepSpeed's default, 1.0 (kDeepSpeedDefaultGradientClipping), as
  // DeepSpeed 0.19.8 runs it: a config that wants no clipping says 0.
  double gradient_clipping = kDeepSpeedDefaultGradientClipping;
  bool gradient_clipping_given = false;  // the config set it (not "auto", not absent)
  std::optional<uint64_t> train_batch_size;                // absent or "auto"
  std::optional<uint64_t> train_micro_batch_size_per_gpu;  // absent or "auto"
  uint64_t gradient_accumulation_steps = 1;
  bool gradient_accumulation_steps_given = false;
  // tensor_parallel.autotp_size: AutoTP degree, 0 = off.
  uint32_t tensor_parallel_autotp_size = 0;
  // One line per key DeepSpeed ignores or deprecates, or setting it ignores
  // for the stage in use: "unknown key 'foo' ignored", ...
  std::vector<std::string> warnings;
};


// Deepest nesting of objects and arrays a config may have. DeepSpeed's own
// configs are at most 5 deep; Python's json refuses about 1000.
inline constexpr int kMaxDeepSpeedConfigDepth = 100;

// Parses the JSON text of a DeepSpeed config. Duplicate keys are refused, as
// DeepSpeed refuses them in a config file.
absl::StatusOr<DeepSpeedConfig> ParseDeepSpeedConfig(absl::string_view json_text);
// Reads and parses a file; NotFound names the path.
absl::StatusOr<DeepSpeedConfig> LoadDeepSpeedConfigFile(const std::string& path);

}  // namespace strata

#endif  // STRATA_CORE_DEEPSPEED_CONFIG_H_
