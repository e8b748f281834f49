#include "plan/memory_planner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/byte_size.h"

namespace strata {
namespace {

// DeepSpeed's additional_buffer_factor, applied to CPU figures as it does.
constexpr double kCpuBufferFactor = 1.5;

// Without a shape, guess the largest module from a GPT-like aspect ratio
// (layers ~ hidden/128, so P ~ 12*h^3/128) and a 50257-token embedding.
uint64_t EstimateLargestLayer(uint64_t params) {
  double h = std::cbrt(static_cast<double>(params) * 128.0 / 12.0);
  double embedding = 50257.0 * h;
  double mlp = 4.0 * h * h;
  return static_cast<uint64_t>(std::min<double>(std::max(embedding, mlp), params));
}

uint64_t Bytes(double value) { return static_cast<uint64_t>(std::llround(value)); }

}  // namespace

const char* StrategyName(Strategy strategy) {
  switch (strategy) {
    case Strategy::kDdp: return "ddp";
    case Strategy::kZero1: return "zero1";
    case Strategy::kZero2: return "zero2";
    case Strategy::kZero3: return "zero3";
    case Strategy::kZero2Offload: return "zero2_offload";
    case Strategy::kZero3OffloadOptimizer: return "zero3_offload_optimizer";
    case Strategy::kZero3OffloadAll: return "zero3_offload_all";
    case Strategy::kZeroInfinity: return "zero_infinity";
  }
  return "unknown";
}

const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kNone: return "none";
    case Tier::kGpu: return "gpu";
    case Tier::kCpu: return "cpu";
    case Tier::kNvme: return "nvme";
  }
  return "unknown";
}

Strategy StrategyForConfig(const DeepSpeedConfig& config) {
  const ZeroConfig& z = config.zero;
  const bool opt_off = z.offload_optimizer.device != OffloadDevice::kNone;
  const bool param_off = z.offload_param.device != OffloadDevice::kNone;
  const bool nvme = z.offload_optimizer.device == OffloadDevice::kNvme ||
                    z.offload_param.device == OffloadDevice::kNvme;
  switch (z.stage) {
    case 0: return Strategy::kDdp;
    case 1: return opt_off ? Strategy::kZero2Offload : Strategy::kZero1;
    case 2: return opt_off ? Strategy::kZero2Offload : Strategy::kZero2;
    default:
      if (nvme) return Strategy::kZeroInfinity;
      if (param_off) return Strategy::kZero3OffloadAll;
      if (opt_off) return Strategy::kZero3OffloadOptimizer;
      return Strategy::kZero3;
  }
}

absl::StatusOr<Plan> MakePlan(const ModelSpec& model, const ClusterSpec& cluster,
                              const OffloadBuffers& buffers) {
  if (model.params == 0) {
    return absl::InvalidArgumentError("--params must be positive (e.g. 1.3B, 7e9)");
  }
  if (cluster.gpus_per_node == 0) return absl::InvalidArgumentError("--gpus-per-node must be at least 1");
  if (cluster.nodes == 0) return absl::InvalidArgumentError("--nodes must be at least 1");
  if (cluster.gpu_bytes == 0) return absl::InvalidArgumentError("--gpu-mem must be positive (e.g. 80GB)");
  if (cluster.tensor_parallel == 0) return absl::InvalidArgumentError("--tp must be at least 1");
  if (cluster.pipeline_parallel == 0) return absl::InvalidArgumentError("--pp must be at least 1");
  const uint64_t total_gpus = cluster.gpus_per_node * cluster.nodes;
  const uint64_t model_parallel = cluster.tensor_parallel * cluster.pipeline_parallel;
  if (total_gpus % model_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp ", cluster.tensor_parallel, " x --pp ", cluster.pipeline_parallel, " = ",
        model_parallel, " does not divide the ", total_gpus,
        " GPUs; expected tp*pp to divide gpus-per-node*nodes"));
  }
  if (cluster.tensor_parallel > cluster.gpus_per_node ||
      cluster.gpus_per_node % cluster.tensor_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp ", cluster.tensor_parallel, " must divide --gpus-per-node ", cluster.gpus_per_node,
        " (tensor parallelism stays inside a node)"));
  }

  Plan plan;
  plan.params = model.params;
  plan.largest_layer_params =
      model.largest_layer_params != 0 ? model.largest_layer_params : EstimateLargestLayer(model.params);
  plan.data_parallel = total_gpus / model_parallel;
  if (model.shape.has_value()) {
    plan.activation_bytes_no_ckpt = ActivationBytes(*model.shape, cluster.tensor_parallel, false);
    plan.activation_bytes_ckpt = ActivationBytes(*model.shape, cluster.tensor_parallel, true);
    plan.activation_bytes =
        model.activation_checkpointing ? plan.activation_bytes_ckpt : plan.activation_bytes_no_ckpt;
  }

  // Model states per GPU before data-parallel sharding, and the largest
  // module as one GPU holds it (tensor parallelism splits it).
  const double pm = static_cast<double>(model.params) / static_cast<double>(model_parallel);
  const double n = static_cast<double>(plan.data_parallel);
  const double gpn = static_cast<double>(cluster.gpus_per_node);
  const double largest = 4.0 * static_cast<double>(plan.largest_layer_params) /
                         static_cast<double>(cluster.tensor_parallel);
  const double largest_params =
      static_cast<double>(plan.largest_layer_params) / static_cast<double>(cluster.tensor_parallel);

  for (int i = 0; i < kNumStrategies; ++i) {
    StrategyEstimate e;
    e.strategy = static_cast<Strategy>(i);
    double gpu = 0, cpu = 0, nvme = 0, pcie = 0, nvme_read = 0, nvme_write = 0;
    switch (e.strategy) {
      case Strategy::kDdp:
        gpu = 16.0 * pm;
        cpu = pm * 4.0 * gpn * kCpuBufferFactor;  // every rank loads the fp32 model
        break;
      case Strategy::kZero1:
      case Strategy::kZero2:
        gpu = 4.0 * pm + 16.0 * pm / n;
        cpu = pm * 4.0 * gpn * kCpuBufferFactor;
        break;
      case Strategy::kZero3:
        gpu = largest + 18.0 * pm / n;
        cpu = largest_params * 4.0 * gpn * kCpuBufferFactor;
        break;
      case Strategy::kZero2Offload:
        gpu = 2.0 * pm;
        cpu = pm * std::max(4.0 * gpn, 16.0 * gpn / n) * kCpuBufferFactor;
        pcie = 4.0 * pm / n;  // fp16 grads down, fp16 params up
        break;
      case Strategy::kZero3OffloadOptimizer:
        gpu = largest + 2.0 * pm / n;
        cpu = pm * 16.0 * gpn / n * kCpuBufferFactor;
        pcie = 4.0 * pm / n;
        break;
      case Strategy::kZero3OffloadAll:
        gpu = largest;
        cpu = pm * 18.0 * gpn / n * kCpuBufferFactor;
        pcie = 6.0 * pm / n;  // params up for forward and backward, grads down
        break;
      case Strategy::kZeroInfinity: {
        gpu = largest;
        // Pinned param buffers and optimizer staging per rank, plus the fp32
        // gradient partition the CPU optimizer reads.
        const double per_rank = 2.0 * buffers.param_buffer_count * buffers.param_buffer_elements +
                                static_cast<double>(buffers.optimizer_staging_bytes) + 4.0 * pm / n;
        cpu = gpn * per_rank;
        nvme = gpn * 14.0 * pm / n;  // fp16 params + fp32 master, m, v
        pcie = 6.0 * pm / n;
        nvme_read = gpn * 16.0 * pm / n;   // params twice, master/m/v once
        nvme_write = gpn * 14.0 * pm / n;  // master/m/v and fp16 params
        break;
      }
    }
    e.gpu_model_states = Bytes(gpu);
    e.gpu_bytes = Bytes(gpu) + plan.activation_bytes + cluster.gpu_reserve_bytes;
    e.cpu_bytes = Bytes(cpu);
    e.nvme_bytes = Bytes(nvme);
    e.pcie_bytes_per_step = Bytes(pcie);
    e.nvme_read_bytes_per_step = Bytes(nvme_read);
    e.nvme_write_bytes_per_step = Bytes(nvme_write);
    if (e.gpu_bytes > cluster.gpu_bytes) e.overflow = Tier::kGpu;
    else if (e.cpu_bytes > cluster.cpu_bytes) e.overflow = Tier::kCpu;
    else if (e.nvme_bytes > cluster.nvme_bytes) e.overflow = Tier::kNvme;
    e.fits = e.overflow == Tier::kNone;
    plan.strategies.push_back(e);
  }

  std::vector<std::string> too_big;
  for (const StrategyEstimate& e : plan.strategies) {
    if (e.fits) {
      plan.recommended = e.strategy;
      break;
    }
    too_big.push_back(StrategyName(e.strategy));
  }
  if (plan.recommended.has_value()) {
    const StrategyEstimate& best = plan.strategies[static_cast<int>(*plan.recommended)];
    if (too_big.empty()) {
      plan.reason = absl::StrCat(StrategyName(best.strategy),
                                 " fits and moves nothing off the GPU, so it is the fastest");
    } else {
      // Name the tier that stopped the strategy just before the winner.
      const StrategyEstimate& prev = plan.strategies[static_cast<int>(*plan.recommended) - 1];
      const uint64_t need = prev.overflow == Tier::kGpu   ? prev.gpu_bytes
                            : prev.overflow == Tier::kCpu ? prev.cpu_bytes
                                                          : prev.nvme_bytes;
      const uint64_t have = prev.overflow == Tier::kGpu   ? cluster.gpu_bytes
                            : prev.overflow == Tier::kCpu ? cluster.cpu_bytes
                                                          : cluster.nvme_bytes;
      plan.reason = absl::StrCat(StrategyName(best.strategy), " is the fastest strategy that fits: ",
                                 absl::StrJoin(too_big, ", "), " overflow (", StrategyName(prev.strategy),
                                 " needs ", FormatBytes(need), " of ", TierName(prev.overflow),
                                 " memory, ", FormatBytes(have), " available)");
    }
  } else {
    const StrategyEstimate& last = plan.strategies.back();
    plan.reason = absl::StrCat("nothing fits: even zero_infinity needs ",
                               FormatBytes(last.overflow == Tier::kGpu   ? last.gpu_bytes
                                           : last.overflow == Tier::kCpu ? last.cpu_bytes
                                                                         : last.nvme_bytes),
                               " of ", TierName(last.overflow),
                               " memory; add GPUs, raise --tp/--pp, or lower the micro-batch");
  }
  return plan;
}

}  // namespace strata
