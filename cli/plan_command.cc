// `strata plan`: which ZeRO strategy fits a model on given hardware.
#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/byte_size.h"
#include "core/command_line.h"
#include "core/deepspeed_config.h"
#include "cli/cli_commands.h"
#include "nlohmann/json.hpp"
#include "plan/memory_planner.h"

namespace strata {
namespace {

std::function<absl::Status(absl::string_view)> SizeFlag(const char* name, uint64_t* out) {
  return [name, out](absl::string_view v) {
    auto parsed = ParseByteSize(v);
    if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", parsed.status().message()));
    *out = *parsed;
    return absl::OkStatus();
  };
}

std::function<absl::Status(absl::string_view)> CountFlag(const char* name, uint64_t* out,
                                                         bool* seen = nullptr) {
  return [name, out, seen](absl::string_view v) {
    auto parsed = ParseCount(v);
    if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", parsed.status().message()));
    *out = *parsed;
    if (seen != nullptr) *seen = true;
    return absl::OkStatus();
  };
}

std::string Gb(uint64_t bytes) { return absl::StrFormat("%.1f GB", static_cast<double>(bytes) / 1e9); }

void PrintTable(const Plan& plan, const ClusterSpec& cluster, const ModelSpec& model,
                std::optional<Strategy> config_strategy) {
  std::printf("model: %s parameters (largest layer %s), data parallel %llu x tp %llu x pp %llu\n",
              FormatCount(plan.params).c_str(), FormatCount(plan.largest_layer_params).c_str(),
              static_cast<unsigned long long>(plan.data_parallel),
              static_cast<unsigned long long>(cluster.tensor_parallel),
              static_cast<unsigned long long>(cluster.pipeline_parallel));
  std::printf("hardware: %llu node(s) x %llu GPU(s) of %s; per node %s CPU memory, %s NVMe\n",
              static_cast<unsigned long long>(cluster.nodes),
              static_cast<unsigned long long>(cluster.gpus_per_node), Gb(cluster.gpu_bytes).c_str(),
              Gb(cluster.cpu_bytes).c_str(), Gb(cluster.nvme_bytes).c_str());
  if (model.shape.has_value()) {
    std::printf("activations per GPU: %s without checkpointing, %s with (counted: %s)\n",
                Gb(plan.activation_bytes_no_ckpt).c_str(), Gb(plan.activation_bytes_ckpt).c_str(),
                model.activation_checkpointing ? "with" : "without");
  }
  std::printf("GPU figures include %s reserved for the CUDA context and allocator; states/gpu are the\n"
              "ZeRO paper's model states, buffers/gpu what DeepSpeed's runtime adds (docs/PLANNER.md)\n\n",
              Gb(cluster.gpu_reserve_bytes).c_str());
  std::printf("%-24s %12s %12s %12s %-10s %12s %12s %12s %12s\n", "strategy", "GPU/gpu", "CPU/node",
              "NVMe/node", "fits", "PCIe/step", "NVMe/step", "states/gpu", "buffers/gpu");
  for (const StrategyEstimate& e : plan.strategies) {
    std::string fits = e.fits ? "yes" : absl::StrCat("no (", TierName(e.overflow), ")");
    std::string name = StrategyName(e.strategy);
    if (config_strategy.has_value() && *config_strategy == e.strategy) name += " *";
    std::printf("%-24s %12s %12s %12s %-10s %12s %12s %12s %12s\n", name.c_str(), Gb(e.gpu_bytes).c_str(),
                Gb(e.cpu_bytes).c_str(), Gb(e.nvme_bytes).c_str(), fits.c_str(),
                Gb(e.pcie_bytes_per_step).c_str(),
                Gb(e.nvme_read_bytes_per_step + e.nvme_write_bytes_per_step).c_str(),
                Gb(e.gpu_model_states).c_str(), Gb(e.gpu_buffers.Total()).c_str());
  }
  std::printf("\nrecommended: %s\n%s\n",
              plan.recommended.has_value() ? StrategyName(*plan.recommended) : "none",
              plan.reason.c_str());
  if (config_strategy.has_value()) {
    const StrategyEstimate& e = plan.strategies[static_cast<int>(*config_strategy)];
    std::printf("your DeepSpeed config (*) selects %s: %s\n", StrategyName(*config_strategy),
                e.fits ? "it fits" : absl::StrCat("it does not fit (", TierName(e.overflow), ")").c_str());
  }
}

void PrintJson(const Plan& plan, uint64_t tensor_parallel, std::optional<Strategy> config_strategy) {
  nlohmann::json out;
  out["strategies"] = nlohmann::json::array();
  for (const StrategyEstimate& e : plan.strategies) {
    out["strategies"].push_back({
        {"name", StrategyName(e.strategy)},
        {"fits", e.fits},
        {"gpu_bytes", e.gpu_bytes},
        {"gpu_model_state_bytes", e.gpu_model_states},
        {"gpu_buffer_bytes", e.gpu_buffers.Total()},
        {"gpu_buffers",
         {{"reduce_buckets", e.gpu_buffers.reduce_buckets},
          {"fp32_gradients", e.gpu_buffers.fp32_gradients},
          {"gathered_params", e.gpu_buffers.gathered_params},
          {"module_gradient", e.gpu_buffers.module_gradient},
          {"persistent_params", e.gpu_buffers.persistent_params},
          {"offload_staging", e.gpu_buffers.offload_staging}}},
        {"cpu_bytes", e.cpu_bytes},
        {"nvme_bytes", e.nvme_bytes},
        {"overflow", e.fits ? nlohmann::json(nullptr) : nlohmann::json(TierName(e.overflow))},
        {"pcie_bytes_per_step", e.pcie_bytes_per_step},
        {"nvme_read_bytes_per_step", e.nvme_read_bytes_per_step},
        {"nvme_write_bytes_per_step", e.nvme_write_bytes_per_step},
    });
  }
  out["recommended"] =
      plan.recommended.has_value() ? nlohmann::json(StrategyName(*plan.recommended)) : nlohmann::json(nullptr);
  out["reason"] = plan.reason;
  out["params"] = plan.params;
  out["largest_layer_params"] = plan.largest_layer_params;
  out["data_parallel"] = plan.data_parallel;
  out["tensor_parallel"] = tensor_parallel;
  out["persistent_params"] = plan.persistent_params;
  out["activation_bytes"] = plan.activation_bytes;
  if (config_strategy.has_value()) {
    out["deepspeed_config"] = {
        {"strategy", StrategyName(*config_strategy)},
        {"fits", plan.strategies[static_cast<int>(*config_strategy)].fits}};
  }
  std::printf("%s\n", out.dump(2).c_str());
}

int UsageError(const absl::Status& status) {
  std::fprintf(stderr, "strata plan: %s\n", std::string(status.message()).c_str());
  return 2;
}

}  // namespace

int RunPlanCommand(int argc, char** argv) {
  ModelSpec model;
  ClusterSpec cluster;
  cluster.gpu_bytes = 80'000'000'000ull;
  cluster.cpu_bytes = 512'000'000'000ull;
  cluster.nvme_bytes = 0;
  TransformerShape shape;
  bool params_seen = false, layers_seen = false, json = false, tp_seen = false;
  std::string deepspeed_config_path;
  ZeroBuffers buffers;

  CommandLine flags("strata plan");
  flags.AddParsed("params", CountFlag("params", &model.params, &params_seen),
                  "parameter count: 1.3B, 7e9, 350M, 1T");
  flags.AddParsed("largest-layer", CountFlag("largest-layer", &model.largest_layer_params),
                  "parameters of the largest module (default: estimated)");
  flags.AddParsed("layers", CountFlag("layers", &shape.layers, &layers_seen),
                  "transformer layers (with --hidden --heads --vocab --seq --micro-batch)");
  flags.AddParsed("hidden", CountFlag("hidden", &shape.hidden), "transformer hidden size");
  flags.AddParsed("heads", CountFlag("heads", &shape.heads), "attention heads");
  flags.AddParsed("vocab", CountFlag("vocab", &shape.vocab), "vocabulary size (default 50257)");
  flags.AddParsed("seq", CountFlag("seq", &shape.seq), "sequence length (default 2048)");
  flags.AddParsed("micro-batch", CountFlag("micro-batch", &shape.micro_batch),
                  "micro-batch per GPU (default 1)");
  flags.AddBool("activation-checkpointing", &model.activation_checkpointing,
                "count activations with full checkpointing (default true)");
  flags.AddParsed("gpus-per-node", CountFlag("gpus-per-node", &cluster.gpus_per_node),
                  "GPUs per node (default 1)");
  flags.AddParsed("nodes", CountFlag("nodes", &cluster.nodes), "nodes (default 1)");
  flags.AddParsed("gpu-mem", SizeFlag("gpu-mem", &cluster.gpu_bytes), "memory of one GPU, e.g. 80GB (default)");
  flags.AddParsed("cpu-mem", SizeFlag("cpu-mem", &cluster.cpu_bytes), "CPU memory per node (default 512GB)");
  flags.AddParsed("nvme", SizeFlag("nvme", &cluster.nvme_bytes), "NVMe space per node (default 0)");
  flags.AddParsed("gpu-reserve", SizeFlag("gpu-reserve", &cluster.gpu_reserve_bytes),
                  "per-GPU memory held back for CUDA context and allocator (default 1GiB)");
  flags.AddParsed("tp", CountFlag("tp", &cluster.tensor_parallel, &tp_seen),
                  "tensor-parallel degree (default 1, or the config's tensor_parallel.autotp_size)");
  flags.AddParsed("pp", CountFlag("pp", &cluster.pipeline_parallel), "pipeline-parallel degree (default 1)");
  flags.AddString("deepspeed-config", &deepspeed_config_path,
                  "evaluate this DeepSpeed JSON config (its stage, offload, bucket and prefetch "
                  "sizes, tensor_parallel.autotp_size)");
  flags.AddBool("json", &json, "print JSON instead of a table");
  shape.vocab = 50257;
  shape.seq = 2048;
  shape.micro_batch = 1;

  if (absl::Status s = flags.Parse(argc, argv); !s.ok()) return UsageError(s);
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  if (!flags.positional().empty()) {
    return UsageError(absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", flags.positional()[0], "'; all inputs are --flags")));
  }
  std::optional<Strategy> config_strategy;
  if (!deepspeed_config_path.empty()) {
    auto config = LoadDeepSpeedConfigFile(deepspeed_config_path);
    if (!config.ok()) {
      return UsageError(absl::InvalidArgumentError(
          absl::StrCat("--deepspeed-config: ", config.status().message())));
    }
    for (const std::string& w : config->warnings) {
      std::fprintf(stderr, "strata plan: warning: %s: %s\n", deepspeed_config_path.c_str(), w.c_str());
    }
    config_strategy = StrategyForConfig(*config);
    buffers = BuffersFromConfig(*config);
    if (absl::Status s = ApplyConfigTensorParallel(*config, tp_seen, &cluster); !s.ok()) {
      return UsageError(absl::InvalidArgumentError(
          absl::StrCat("--deepspeed-config: ", s.message())));
    }
    if (config->train_micro_batch_size_per_gpu.has_value()) {
      shape.micro_batch = *config->train_micro_batch_size_per_gpu;
    }
  }
  if (layers_seen) {
    if (absl::Status s = ValidateTransformerShape(shape); !s.ok()) return UsageError(s);
    if (params_seen) {
      return UsageError(absl::InvalidArgumentError(
          "--params and --layers both given; give a parameter count or a transformer shape"));
    }
    model.params = TransformerParams(shape);
    if (model.largest_layer_params == 0) model.largest_layer_params = TransformerLargestLayerParams(shape);
    model.shape = shape;
  } else if (!params_seen) {
    return UsageError(absl::InvalidArgumentError(
        "--params is required (e.g. --params 1.3B), or a shape with --layers --hidden --heads"));
  }
  auto plan = MakePlan(model, cluster, buffers);
  if (!plan.ok()) return UsageError(plan.status());
  if (json) {
    PrintJson(*plan, cluster.tensor_parallel, config_strategy);
  } else {
    PrintTable(*plan, cluster, model, config_strategy);
  }
  return 0;
}

}  // namespace strata
