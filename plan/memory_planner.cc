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
// Bytes of a 16-bit (fp16/bf16) element: params, gradients, buckets.
constexpr double k16 = 2.0;
// Bytes of an fp32 element.
constexpr double k32 = 4.0;

// Without a shape, guess a GPT-like aspect ratio (layers ~ hidden/128, so
// P ~ 12*h^3/128) and a 50257-token embedding.
double EstimateHidden(uint64_t params) { return std::cbrt(static_cast<double>(params) * 128.0 / 12.0); }

uint64_t EstimateLargestLayer(uint64_t params) {
  double h = EstimateHidden(params);
  double embedding = 50257.0 * h;
  double mlp = 4.0 * h * h;
  return static_cast<uint64_t>(std::min<double>(std::max(embedding, mlp), params));
}

// The same guessed shape, for the small tensors ZeRO-3 keeps whole.
uint64_t EstimatePersistentParams(uint64_t params, uint64_t threshold) {
  TransformerShape shape;
  shape.hidden = std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(EstimateHidden(params))));
  shape.layers = std::max<uint64_t>(
      1, static_cast<uint64_t>(static_cast<double>(params) /
                               (12.0 * static_cast<double>(shape.hidden) * static_cast<double>(shape.hidden))));
  shape.vocab = 50257;
  shape.seq = 2048;
  return std::min(params, TransformerPersistentParams(shape, threshold));
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

ZeroBuffers BuffersFromConfig(const DeepSpeedConfig& config) {
  const ZeroConfig& z = config.zero;
  ZeroBuffers b;
  b.reduce_bucket_size = z.reduce_bucket_size;
  b.contiguous_gradients = z.contiguous_gradients;
  // The parser sets overlap_comm to DeepSpeed's stage-dependent default (true
  // at stage 3), so it speaks for the stage-1/2 rows only when the config is
  // a stage-1/2 config; otherwise those rows keep DeepSpeed's stage-1/2
  // default (false).
  b.overlap_comm_stage12 = (z.stage == 1 || z.stage == 2) && z.overlap_comm;
  b.sub_group_size = z.sub_group_size;
  b.stage3_prefetch_bucket_size = z.stage3_prefetch_bucket_size;
  b.stage3_max_live_parameters = z.stage3_max_live_parameters;
  b.stage3_param_persistence_threshold = z.stage3_param_persistence_threshold;
  b.param_buffer_count = z.offload_param.buffer_count;
  b.param_buffer_elements = z.offload_param.buffer_size;
  return b;
}

absl::Status ApplyConfigTensorParallel(const DeepSpeedConfig& config, bool tp_flag_given,
                                       ClusterSpec* cluster) {
  const uint64_t autotp = config.tensor_parallel_autotp_size;
  if (autotp == 0) return absl::OkStatus();  // unset: DeepSpeed's AutoTP is off
  if (tp_flag_given && cluster->tensor_parallel != autotp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tp ", cluster->tensor_parallel, " differs from the config's tensor_parallel.autotp_size ",
        autotp, "; give one or make them equal"));
  }
  cluster->tensor_parallel = autotp;
  return absl::OkStatus();
}

absl::StatusOr<Plan> MakePlan(const ModelSpec& model, const ClusterSpec& cluster,
                              const ZeroBuffers& buffers) {
  if (model.params == 0) {
    return absl::InvalidArgumentError("--params must be positive (e.g. 1.3B, 7e9)");
  }
  if (cluster.gpus_per_node == 0) return absl::InvalidArgumentError("--gpus-per-node must be at least 1");
  if (cluster.nodes == 0) return absl::InvalidArgumentError("--nodes must be at least 1");
  if (cluster.gpu_bytes == 0) return absl::InvalidArgumentError("--gpu-mem must be positive (e.g. 80GB)");
  if (cluster.tensor_parallel == 0) return absl::InvalidArgumentError("--tp must be at least 1");
  // The figures are computed in doubles and rounded to uint64; these bounds
  // keep every product (at most ~20 bytes x elements x GPUs per node) far
  // below 2^64.
  constexpr uint64_t kMaxElements = 1'000'000'000'000'000ull;  // 1e15
  if (model.params > kMaxElements) {
    return absl::InvalidArgumentError(absl::StrCat("--params ", model.params, " is above the planner's limit of 1e15"));
  }
  if (cluster.gpus_per_node > 4096) {
    return absl::InvalidArgumentError(absl::StrCat("--gpus-per-node ", cluster.gpus_per_node, " is above 4096"));
  }
  struct Limit {
    const char* key;
    uint64_t value;
  };
  for (Limit l : {Limit{"zero_optimization.reduce_bucket_size", buffers.reduce_bucket_size},
                  Limit{"zero_optimization.sub_group_size", buffers.sub_group_size},
                  Limit{"zero_optimization.stage3_prefetch_bucket_size", buffers.stage3_prefetch_bucket_size},
                  Limit{"zero_optimization.stage3_max_live_parameters", buffers.stage3_max_live_parameters},
                  Limit{"zero_optimization.offload_param.buffer_size", buffers.param_buffer_elements},
                  Limit{"zero_optimization.offload_param.buffer_count", buffers.param_buffer_count}}) {
    if (l.value > kMaxElements) {
      return absl::InvalidArgumentError(absl::StrCat(l.key, " ", l.value, " is above the planner's limit of 1e15"));
    }
  }
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

  // Parameters per model-parallel rank, the largest module as one GPU holds
  // it (tensor parallelism splits it), and the stage-3 persistent params.
  const double pm = static_cast<double>(model.params) / static_cast<double>(model_parallel);
  const double n = static_cast<double>(plan.data_parallel);
  const double gpn = static_cast<double>(cluster.gpus_per_node);
  const double largest_params =
      static_cast<double>(plan.largest_layer_params) / static_cast<double>(cluster.tensor_parallel);
  plan.persistent_params =
      model.shape.has_value()
          ? TransformerPersistentParams(*model.shape, buffers.stage3_param_persistence_threshold)
          : EstimatePersistentParams(model.params, buffers.stage3_param_persistence_threshold);
  const double persistent = std::min(static_cast<double>(plan.persistent_params), pm);

  // The runtime buffers, shared by the strategies that hold them.
  const double rbs = static_cast<double>(buffers.reduce_bucket_size);
  // stage_1_and_2.py setup_buckets: one bucket buffer with
  // contiguous_gradients, a second with overlap_comm. CPU offload forces
  // contiguous_gradients on (`contiguous_gradients or cpu_offload`).
  auto stage12_buckets = [&](bool offload) {
    const bool contiguous = buffers.contiguous_gradients || offload;
    if (!contiguous) return 0.0;
    return k16 * rbs * (buffers.overlap_comm_stage12 ? 2.0 : 1.0);
  };
  // stage3.py: one ipg bucket buffer when contiguous_gradients.
  const double stage3_bucket = buffers.contiguous_gradients ? k16 * rbs : 0.0;
  // partitioned_param_coordinator.py fetch_sub_module: the module in use is
  // gathered whatever the limits; prefetch adds at most
  // min(max_live - available, prefetch_bucket) more. Persistent params are
  // never gathered (they are always whole).
  const double live_limit = std::max(
      largest_params, std::min(static_cast<double>(buffers.stage3_max_live_parameters),
                               largest_params + static_cast<double>(buffers.stage3_prefetch_bucket_size)));
  const double gathered = k16 * std::min(live_limit, std::max(0.0, pm - persistent));
  const double module_grad = k16 * largest_params;
  const double persistent_bytes = k16 * persistent;

  for (int i = 0; i < kNumStrategies; ++i) {
    StrategyEstimate e;
    e.strategy = static_cast<Strategy>(i);
    double gpu = 0, cpu = 0, nvme = 0, pcie = 0, nvme_read = 0, nvme_write = 0;
    GpuBuffers& buf = e.gpu_buffers;
    // Stage-3 strategies hold the same parameter-side buffers on the GPU.
    auto stage3_param_buffers = [&]() {
      buf.reduce_buckets = Bytes(stage3_bucket);
      buf.gathered_params = Bytes(gathered);
      buf.module_gradient = Bytes(module_grad);
      buf.persistent_params = Bytes(persistent_bytes);
    };
    switch (e.strategy) {
      case Strategy::kDdp:
        // 2 fp16 params + 2 fp16 grads + 12 fp32 master, m, v.
        gpu = 16.0 * pm;
        // engine.py allreduce_gradients flattens up to 5e8 grads at a time;
        // fused_optimizer.py step makes the fp32 flat gradient.
        buf.reduce_buckets = Bytes(k16 * std::min(static_cast<double>(buffers.allreduce_bucket_size), pm));
        buf.fp32_gradients = Bytes(k32 * pm);
        cpu = pm * 4.0 * gpn * kCpuBufferFactor;  // every rank loads the fp32 model
        break;
      case Strategy::kZero1:
        // Whole fp16 params and grads, optimizer states partitioned.
        gpu = 4.0 * pm + 12.0 * pm / n;
        buf.reduce_buckets = Bytes(stage12_buckets(false));
        // step(): single_grad_partition = flat_grad_partition.to(fp32).
        buf.fp32_gradients = Bytes(k32 * pm / n);
        cpu = pm * 4.0 * gpn * kCpuBufferFactor;
        break;
      case Strategy::kZero2:
        // Gradients partitioned too: each rank keeps 2P/N (grads_in_partition).
        gpu = 2.0 * pm + 14.0 * pm / n;
        buf.reduce_buckets = Bytes(stage12_buckets(false));
        buf.fp32_gradients = Bytes(k32 * pm / n);
        // A gradient exists whole until its hook copies it into the bucket.
        buf.module_gradient = Bytes(module_grad);
        cpu = pm * 4.0 * gpn * kCpuBufferFactor;
        break;
      case Strategy::kZero3:
        gpu = 16.0 * pm / n;
        stage3_param_buffers();
        // initialize_optimizer_states: one fp32 gradient buffer as long as
        // the largest sub-group.
        buf.fp32_gradients =
            Bytes(k32 * std::min(static_cast<double>(buffers.sub_group_size), pm / n));
        cpu = largest_params * 4.0 * gpn * kCpuBufferFactor;  // zero.Init builds layer by layer
        break;
      case Strategy::kZero2Offload: {
        gpu = 2.0 * pm;  // fp16 params stay whole on the GPU
        buf.reduce_buckets = Bytes(stage12_buckets(true));
        buf.module_gradient = Bytes(module_grad);
        // temp_grad_buffer_for_gpu_offload: one largest-param-long fp16 buffer.
        buf.offload_staging = Bytes(k16 * largest_params);
        // Per rank, pinned: fp32 master, grad, m, v (16) and the fp16 param
        // buffer (2) per partition, the largest-param CPU grad buffer; at
        // start-up each rank loads the whole fp32 model.
        const double per_rank = std::max(4.0 * pm, 18.0 * pm / n + k16 * largest_params);
        cpu = per_rank * gpn * kCpuBufferFactor;
        pcie = 4.0 * pm / n;  // fp16 grads down, fp16 params up
        break;
      }
      case Strategy::kZero3OffloadOptimizer:
        gpu = 2.0 * pm / n;  // the fp16 param partition
        stage3_param_buffers();
        // Per rank on the CPU: fp32 master, m, v (12), fp32 grad (4), and the
        // fp16 gradient partitions (grad_partitions_flat_buffer, 2).
        cpu = 18.0 * pm / n * gpn * kCpuBufferFactor;
        pcie = 4.0 * pm / n;
        break;
      case Strategy::kZero3OffloadAll:
        gpu = 0;
        stage3_param_buffers();
        cpu = 20.0 * pm / n * gpn * kCpuBufferFactor;  // and the fp16 param partition
        pcie = 6.0 * pm / n;  // params up for forward and backward, grads down
        break;
      case Strategy::kZeroInfinity: {
        gpu = 0;
        stage3_param_buffers();
        // Pinned param buffers and optimizer staging per rank, plus the fp32
        // gradient partition the CPU optimizer reads.
        const double per_rank = k16 * buffers.param_buffer_count * buffers.param_buffer_elements +
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
    e.gpu_bytes = e.gpu_model_states + buf.Total() + plan.activation_bytes + cluster.gpu_reserve_bytes;
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
