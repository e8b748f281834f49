// strata-dsconfig-dump FILE...: prints what ParseDeepSpeedConfig reads from
// each DeepSpeed config, one JSON object per line: {"ok": true, "config":
// {...}, "warnings": [...]} or {"ok": false, "code": "...", "error": "..."}.
// The conformance test (tests/deepspeed_conformance) compares it with what
// DeepSpeed's own parser reads. Exit status 0 either way; 2 on bad usage.
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "core/deepspeed_config.h"
#include "nlohmann/json.hpp"

namespace {

using Json = nlohmann::ordered_json;

Json Dump(const strata::DeepSpeedConfig& c) {
  const strata::ZeroConfig& z = c.zero;
  const auto& oo = z.offload_optimizer;
  const auto& op = z.offload_param;
  Json j;
  j["zero"] = {
      {"stage", z.stage},
      {"offload_optimizer",
       {{"device", strata::OffloadDeviceName(oo.device)}, {"nvme_path", oo.nvme_path},
        {"pin_memory", oo.pin_memory}, {"buffer_count", oo.buffer_count},
        {"pipeline_read", oo.pipeline_read}, {"pipeline_write", oo.pipeline_write},
        {"fast_init", oo.fast_init}, {"ratio", oo.ratio}, {"super_offload", oo.super_offload},
        {"cpuadam_cores_perc", oo.cpuadam_cores_perc}, {"nvme_ran_as_cpu", oo.nvme_ran_as_cpu},
        {"ignored", oo.ignored}}},
      {"offload_param",
       {{"device", strata::OffloadDeviceName(op.device)}, {"nvme_path", op.nvme_path},
        {"pin_memory", op.pin_memory}, {"buffer_count", op.buffer_count},
        {"buffer_size", op.buffer_size}, {"max_in_cpu", op.max_in_cpu}, {"ignored", op.ignored}}},
      {"sub_group_size", z.sub_group_size},
      {"prefetch_bucket_size", z.stage3_prefetch_bucket_size},
      {"prefetch_bucket_size_auto", z.stage3_prefetch_bucket_size_auto},
      {"max_live_parameters", z.stage3_max_live_parameters},
      {"max_reuse_distance", z.stage3_max_reuse_distance},
      {"param_persistence_threshold", z.stage3_param_persistence_threshold},
      {"param_persistence_threshold_auto", z.stage3_param_persistence_threshold_auto},
      {"model_persistence_threshold", z.stage3_model_persistence_threshold},
      {"gather_16bit_weights_on_model_save", z.gather_16bit_weights_on_model_save},
      {"overlap_comm", z.overlap_comm},
      {"contiguous_gradients", z.contiguous_gradients},
      {"reduce_bucket_size", z.reduce_bucket_size},
      {"reduce_bucket_size_auto", z.reduce_bucket_size_auto},
      {"reduce_scatter", z.reduce_scatter},
      {"allgather_partitions", z.allgather_partitions},
      {"allgather_bucket_size", z.allgather_bucket_size},
      {"round_robin_gradients", z.round_robin_gradients},
      {"zero_hpz_partition_size", z.zero_hpz_partition_size},
      {"compute_grad_norm", z.compute_grad_norm},
  };
  const strata::LossScaleConfig& f = c.fp16;
  j["fp16"] = {{"enabled", f.enabled},
               {"loss_scale", f.loss_scale},
               {"initial_scale_power", f.initial_scale_power},
               {"loss_scale_window", f.loss_scale_window},
               {"hysteresis", f.hysteresis},
               {"min_loss_scale", f.min_loss_scale},
               {"consecutive_hysteresis", f.consecutive_hysteresis},
               {"auto_cast", f.auto_cast},
               {"fp16_master_weights_and_grads", f.fp16_master_weights_and_grads}};
  j["bf16_enabled"] = c.bf16_enabled;
  if (c.optimizer.has_value()) {
    const strata::OptimizerConfig& o = *c.optimizer;
    j["optimizer"] = {{"kind", strata::OptimizerKindName(o.kind)},
                      {"type", o.type},
                      {"lr", o.lr},
                      {"lr_auto", o.lr_auto},
                      {"betas", {o.betas[0], o.betas[1]}},
                      {"eps", o.eps},
                      {"weight_decay", o.weight_decay},
                      {"amsgrad", o.amsgrad},
                      {"lr_decay", o.lr_decay},
                      {"initial_accumulator_value", o.initial_accumulator_value},
                      {"unusable", o.unusable}};
  } else {
    j["optimizer"] = nullptr;
  }
  j["gradient_clipping"] = c.gradient_clipping;
  j["gradient_clipping_given"] = c.gradient_clipping_given;
  j["train_batch_size"] = c.train_batch_size.has_value() ? Json(*c.train_batch_size) : Json();
  j["train_micro_batch_size_per_gpu"] =
      c.train_micro_batch_size_per_gpu.has_value() ? Json(*c.train_micro_batch_size_per_gpu) : Json();
  j["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
  j["gradient_accumulation_steps_given"] = c.gradient_accumulation_steps_given;
  j["tensor_parallel_autotp_size"] = c.tensor_parallel_autotp_size;
  j["aio"] = {{"block_size", c.aio.block_size},
              {"queue_depth", c.aio.queue_depth},
              {"intra_op_parallelism", c.aio.intra_op_parallelism},
              {"single_submit", c.aio.single_submit},
              {"overlap_events", c.aio.overlap_events},
              {"use_gds", c.aio.use_gds}};
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: strata-dsconfig-dump DS_CONFIG.json...\n");
    return 2;
  }
  for (int i = 1; i < argc; ++i) {
    auto config = strata::LoadDeepSpeedConfigFile(argv[i]);
    Json out;
    if (config.ok()) {
      out["ok"] = true;
      out["config"] = Dump(*config);
      out["warnings"] = config->warnings;
    } else {
      out["ok"] = false;
      out["code"] = absl::StatusCodeToString(config.status().code());
      out["error"] = std::string(config.status().message());
    }
    // Messages may quote bytes of the input: never let them break the JSON.
    std::cout << out.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
  }
  return 0;
}
