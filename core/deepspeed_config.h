// DeepSpeedConfig: the parts of a DeepSpeed JSON config that strata acts on,
// read with DeepSpeed's defaults so users keep the file they have.
//
// Reading follows DeepSpeed (0.14-0.16 config docs):
// - a missing key takes DeepSpeed's default (listed beside each field);
// - "auto" is accepted where the HF/DeepSpeed integration accepts it, and means
//   "use the default" (the field's `*_auto` flag records that it was auto);
// - numbers may be written 5e8 or "5e8" and must be whole where a count is meant;
// - a key strata does not know gives a warning naming its path; keys DeepSpeed
//   knows that strata does not act on (scheduler, logging, ...) are accepted
//   silently;
// - an invalid value is InvalidArgument naming the key path and what is allowed.
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

enum class OptimizerKind : uint8_t { kAdam = 0, kAdamW = 1, kAdagrad = 2, kLion = 3, kLamb = 4 };
absl::string_view OptimizerKindName(OptimizerKind kind);

struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;  // "none"
  std::string nvme_path;                        // required for nvme
  bool pin_memory = false;
  uint32_t buffer_count = 4;
  bool pipeline_read = false;
  bool pipeline_write = false;
  double ratio = 1.0;  // fraction of optimizer states offloaded, (0, 1]
};

struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  uint32_t buffer_count = 5;
  uint64_t buffer_size = 100'000'000;    // elements
  uint64_t max_in_cpu = 1'000'000'000;   // elements
  bool pin_memory = false;
};

struct ZeroConfig {
  int stage = 0;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  uint64_t sub_group_size = 1'000'000'000;
  uint64_t stage3_prefetch_bucket_size = 50'000'000;
  bool stage3_prefetch_bucket_size_auto = false;
  uint64_t stage3_max_live_parameters = 1'000'000'000;
  uint64_t stage3_max_reuse_distance = 1'000'000'000;
  uint64_t stage3_param_persistence_threshold = 100'000;
  bool stage3_param_persistence_threshold_auto = false;
  bool overlap_comm = false;  // DeepSpeed: true by default at stage 3
  bool contiguous_gradients = true;
  uint64_t reduce_bucket_size = 500'000'000;
  bool reduce_bucket_size_auto = false;
};

struct AioConfig {
  uint64_t block_size = 1'048'576;
  uint32_t queue_depth = 8;
  uint32_t intra_op_parallelism = 1;  // old name: thread_count
  bool single_submit = false;
  bool overlap_events = true;
};

struct LossScaleConfig {
  bool enabled = false;
  double loss_scale = 0;  // 0 = dynamic loss scaling
  int initial_scale_power = 16;
  uint32_t loss_scale_window = 1000;
  uint32_t hysteresis = 2;
  double min_loss_scale = 1;
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;
  std::array<double, 2> betas = {0.9, 0.999};  // Lion: {0.9, 0.99}
  double eps = 1e-8;
  double weight_decay = 0;
  bool amsgrad = false;
  // Adagrad only.
  double lr_decay = 0;
  double initial_accumulator_value = 0;
  // Which values were "auto" (filled from defaults).
  bool lr_auto = false;
};

struct DeepSpeedConfig {
  ZeroConfig zero;
  AioConfig aio;
  LossScaleConfig fp16;
  bool bf16_enabled = false;
  std::optional<OptimizerConfig> optimizer;  // absent: the trainer brings its own
  double gradient_clipping = 0;              // 0 = off
  std::optional<uint64_t> train_micro_batch_size_per_gpu;  // absent or "auto"
  uint64_t gradient_accumulation_steps = 1;
  uint32_t tensor_parallel_autotp_size = 0;  // tensor_parallel.autotp_size; 0 = unset
  // One line per unknown key: "unknown key 'zero_optimization.foo' ignored".
  std::vector<std::string> warnings;
};

// Parses the JSON text of a DeepSpeed config.
absl::StatusOr<DeepSpeedConfig> ParseDeepSpeedConfig(absl::string_view json_text);
// Reads and parses a file; NotFound names the path.
absl::StatusOr<DeepSpeedConfig> LoadDeepSpeedConfigFile(const std::string& path);

}  // namespace strata

#endif  // STRATA_CORE_DEEPSPEED_CONFIG_H_
