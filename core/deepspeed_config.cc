#include "core/deepspeed_config.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/deepspeed_config_json.h"
#include "core/deepspeed_config_model.h"
#include "core/deepspeed_config_pyvalue.h"
#include "core/status_macros.h"

namespace strata {
namespace {

using dsconfig::Describe;
using dsconfig::IntBounds;
using dsconfig::InvalidValue;
using dsconfig::IsAuto;
using dsconfig::Json;
using dsconfig::ModelReader;

constexpr IntBounds kNonNegative{.min = 0};
constexpr IntBounds kPositive{.min = 1};
constexpr IntBounds kAnyInt{};

using Warnings = std::vector<std::string>;

constexpr char kRemovedIssue[] = "https://github.com/deepspeedai/DeepSpeed/issues/8489";

// Top-level keys DeepSpeed 0.19.8 refuses outright (runtime/config.py,
// _REMOVED_TOP_LEVEL_CONFIG_KEYS), in its order, with what it says.
constexpr std::pair<const char*, const char*> kRemovedTopLevel[] = {
    {"nebula", "Nebula checkpointing has been removed"},
    {"compression_training", "the DeepSpeed compression library has been removed"},
    {"amp", "NVIDIA Apex AMP integration has been removed; use 'fp16', 'bf16' or 'torch_autocast'"},
    {"quantize_training", "Mixture-of-Quantization (MoQ) / 'quantize_training' has been removed"},
    {"sparse_gradients", "sparse compression of dense torch.nn.Embedding gradients has been removed"},
    {"eigenvalue", "eigenvalue-based Mixture-of-Quantization (MoQ) has been removed"},
    {"sparse_attention", "DeepSpeed Sparse Attention has been removed"},
    {"elasticity",
     "elastic training has been removed; set train_batch_size / train_micro_batch_size_per_gpu / "
     "gradient_accumulation_steps directly"},
    {"graph_harvesting", "graph harvesting has been removed"},
    {"curriculum_learning",
     "legacy top-level 'curriculum_learning' has been removed; use "
     "'data_efficiency.data_sampling.curriculum_learning'"},
    {"progressive_layer_drop", "Progressive Layer Dropping has been removed"},
};
constexpr std::pair<const char*, const char*> kRemovedZero[] = {
    {"mics_shard_size", "MiCS ZeRO-3 sharding has been removed"},
    {"mics_hierarchical_params_gather", "MiCS ZeRO-3 sharding has been removed"},
    {"zeropp_loco_param", "LoCo-Zero++ has been removed"},
};

// Every top-level key DeepSpeed 0.19.8's DeepSpeedConfig reads (measured by
// recording its lookups); any other top-level key it ignores, and so strata
// warns about it. The removed keys above are refused before this matters.
constexpr const char* kKnownTopLevel[] = {
    "activation_checkpointing", "aio", "allgather_size", "autotuning", "bf16", "bfloat16",
    "checkpoint", "comet", "comms_logger", "communication_data_type", "compile", "csv_monitor",
    "data_efficiency", "data_types", "dataloader_drop_last", "datastates_ckpt", "disable_allgather",
    "disable_python_gc", "dump_state", "expert_parallel", "flops_profiler", "fp16",
    "gradient_accumulation_steps", "gradient_allreduce_op", "gradient_clipping",
    "gradient_predivide_factor", "hybrid_engine", "log_level", "managed_gradient_accumulation",
    "memory_breakdown", "optimizer", "pipeline", "prescale_gradients", "scheduler",
    "seq_parallel_communication_data_type", "sequence_parallel_size", "steps_per_print",
    "tensor_parallel", "tensorboard", "timers", "torch_autocast", "train_batch_size",
    "train_micro_batch_size_per_gpu", "use_data_before_expert_parallelism", "vocabulary_size",
    "wall_clock_breakdown", "wandb", "weight_quantization", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "zero_optimization",
};

// Python truthiness of a JSON value, for the few places DeepSpeed tests one.
bool Truthy(const Json& v) {
  if (v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string() || v.is_array() || v.is_object()) return !v.empty();
  return true;
}

absl::Status ReadOffloadDevice(ModelReader& r, OffloadDevice* out) {
  std::string text = "none";
  STRATA_RETURN_IF_ERROR(r.Enum("device", &text, {"none", "cpu", "nvme"}));
  *out = text == "cpu" ? OffloadDevice::kCpu : text == "nvme" ? OffloadDevice::kNvme : OffloadDevice::kNone;
  return absl::OkStatus();
}

// DeepSpeedZeroOffloadOptimizerConfig (runtime/zero/offload_config.py).
absl::Status ReadOffloadOptimizer(const Json& value, const std::string& path,
                                  OffloadOptimizerConfig* c) {
  STRATA_ASSIGN_OR_RETURN(ModelReader r, ModelReader::Open(value, path));
  STRATA_RETURN_IF_ERROR(ReadOffloadDevice(r, &c->device));
  STRATA_RETURN_IF_ERROR(r.OptString("nvme_path", &c->nvme_path));
  STRATA_RETURN_IF_ERROR(r.Int("buffer_count", &c->buffer_count, kNonNegative));
  STRATA_RETURN_IF_ERROR(r.Bool("pin_memory", &c->pin_memory));
  STRATA_RETURN_IF_ERROR(r.Bool("pipeline_read", &c->pipeline_read));
  STRATA_RETURN_IF_ERROR(r.Bool("pipeline_write", &c->pipeline_write));
  STRATA_RETURN_IF_ERROR(r.Bool("fast_init", &c->fast_init));
  STRATA_RETURN_IF_ERROR(r.Float("ratio", &c->ratio, 0.0, 1.0));
  STRATA_RETURN_IF_ERROR(r.Bool("super_offload", &c->super_offload));
  STRATA_RETURN_IF_ERROR(r.Float("cpuadam_cores_perc", &c->cpuadam_cores_perc, 0.0, 1.0));
  return r.Finish();
}

// DeepSpeedZeroOffloadParamConfig.
absl::Status ReadOffloadParam(const Json& value, const std::string& path, OffloadParamConfig* c) {
  STRATA_ASSIGN_OR_RETURN(ModelReader r, ModelReader::Open(value, path));
  STRATA_RETURN_IF_ERROR(ReadOffloadDevice(r, &c->device));
  STRATA_RETURN_IF_ERROR(r.OptString("nvme_path", &c->nvme_path));
  STRATA_RETURN_IF_ERROR(r.Int("buffer_count", &c->buffer_count, kNonNegative));
  STRATA_RETURN_IF_ERROR(r.Int("buffer_size", &c->buffer_size, kNonNegative));
  STRATA_RETURN_IF_ERROR(r.Int("max_in_cpu", &c->max_in_cpu, kNonNegative));
  STRATA_RETURN_IF_ERROR(r.Bool("pin_memory", &c->pin_memory));
  return r.Finish();
}

// A deprecated Optional[bool] whose true means "offload to cpu" in the
// section `replacement` (DeepSpeedConfigModel._process_deprecated_field):
// giving both is an error even when the old key says false or null.
absl::Status ReadDeprecatedOffload(ModelReader& r, absl::string_view old_key,
                                   absl::string_view replacement, bool replacement_given,
                                   Warnings* warnings, bool* offload_cpu) {
  std::optional<bool> value;
  bool given = false;
  STRATA_RETURN_IF_ERROR(r.OptBool(old_key, &value, &given));
  if (!given) return absl::OkStatus();
  if (replacement_given) {
    return absl::InvalidArgumentError(absl::StrCat(
        r.PathOf(old_key), ": the deprecated key and its replacement '", r.PathOf(replacement),
        "' are both given; DeepSpeed refuses that, keep '", replacement, "'"));
  }
  warnings->push_back(absl::StrCat("'", r.PathOf(old_key), "' is deprecated; DeepSpeed reads it as ",
                                   replacement, value.value_or(false) ? " {\"device\": \"cpu\"}" : " none",
                                   "; write '", replacement, "' instead"));
  *offload_cpu = value.value_or(false);
  return absl::OkStatus();
}

// DeepSpeedZeroConfig (runtime/zero/config.py), also in its deprecated
// boolean form.
absl::Status ReadZero(const Json& value, const Json& root, Warnings* warnings, ZeroConfig* z) {
  if (value.is_boolean()) {
    // read_zero_config_deprecated: true is stage 1 with allgather_size.
    warnings->push_back(
        "'zero_optimization': true/false is deprecated; DeepSpeed reads it as stage 1/0; write "
        "{\"stage\": N}");
    z->stage = value.get<bool>() ? 1 : 0;
    if (z->stage > 0) {
      Json holder = Json::object();
      if (auto it = root.find("allgather_size"); it != root.end()) holder["allgather_bucket_size"] = *it;
      STRATA_ASSIGN_OR_RETURN(ModelReader r, ModelReader::Open(holder, "allgather_size"));
      STRATA_RETURN_IF_ERROR(r.Int("allgather_bucket_size", &z->allgather_bucket_size, kNonNegative));
    }
    return absl::OkStatus();
  }
  STRATA_ASSIGN_OR_RETURN(ModelReader r, ModelReader::Open(value, "zero_optimization"));
  if (auto v = r.Field("stage"); !v.ok()) {
    return v.status();
  } else if (*v != nullptr) {
    std::optional<int64_t> stage = dsconfig::PyInt(**v);
    if (!stage.has_value() || *stage < 0 || *stage > 3) {
      return InvalidValue(r.PathOf("stage"), **v, "one of 0, 1, 2, 3");
    }
    z->stage = static_cast<int>(*stage);
  }
  STRATA_RETURN_IF_ERROR(r.Bool("contiguous_gradients", &z->contiguous_gradients));
  STRATA_RETURN_IF_ERROR(r.Bool("reduce_scatter", &z->reduce_scatter));
  z->reduce_bucket_size_auto = r.WasAuto("reduce_bucket_size");
  STRATA_RETURN_IF_ERROR(r.Int("reduce_bucket_size", &z->reduce_bucket_size, kPositive));
  bool unused = false;
  STRATA_RETURN_IF_ERROR(r.Bool("use_multi_rank_bucket_allreduce", &unused));
  STRATA_RETURN_IF_ERROR(r.Bool("allgather_partitions", &z->allgather_partitions));
  STRATA_RETURN_IF_ERROR(r.Int("allgather_bucket_size", &z->allgather_bucket_size, kNonNegative));
  std::optional<bool> overlap_comm;
  bool given = false;
  STRATA_RETURN_IF_ERROR(r.OptBool("overlap_comm", &overlap_comm, &given));
  STRATA_RETURN_IF_ERROR(r.Bool("compute_grad_norm", &z->compute_grad_norm));
  for (const char* key : {"load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters",
                          "legacy_stage1", "parameter_alignment", "zero_quantized_weights",
                          "zero_quantized_nontrainable_weights", "zero_quantized_gradients",
                          "memory_efficient_linear", "pipeline_loading_checkpoint",
                          "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
                          "save_muon_momentum_buffer_in_memory"}) {
    STRATA_RETURN_IF_ERROR(r.Bool(key, &unused));
  }
  STRATA_RETURN_IF_ERROR(r.Bool("use_all_reduce_for_fetch_params", &unused,
                                "stage3_use_all_reduce_for_fetch_params"));
  STRATA_RETURN_IF_ERROR(r.Bool("allgather_sequential", &unused, "stage3_allgather_sequential"));
  STRATA_RETURN_IF_ERROR(r.Bool("round_robin_gradients", &z->round_robin_gradients));
  STRATA_RETURN_IF_ERROR(r.Int("zero_hpz_partition_size", &z->zero_hpz_partition_size, kNonNegative));

  // offload_param / offload_optimizer: Optional[model]; null is "none".
  const bool offload_param_given = r.Given("offload_param");
  const bool offload_optimizer_given = r.Given("offload_optimizer");
  STRATA_ASSIGN_OR_RETURN(const Json* op, r.Field("offload_param"));
  if (op != nullptr && !op->is_null()) {
    STRATA_RETURN_IF_ERROR(ReadOffloadParam(*op, r.PathOf("offload_param"), &z->offload_param));
  }
  STRATA_ASSIGN_OR_RETURN(const Json* oo, r.Field("offload_optimizer"));
  const bool has_offload_optimizer = oo != nullptr && !oo->is_null();
  if (has_offload_optimizer) {
    STRATA_RETURN_IF_ERROR(
        ReadOffloadOptimizer(*oo, r.PathOf("offload_optimizer"), &z->offload_optimizer));
  }
  STRATA_RETURN_IF_ERROR(r.OptObject("zenflow"));
  STRATA_RETURN_IF_ERROR(r.OptObject("leaf_module"));  // DeepSpeed takes null as its default
  STRATA_RETURN_IF_ERROR(r.Int("sub_group_size", &z->sub_group_size, kNonNegative));

  z->stage3_prefetch_bucket_size_auto = r.WasAuto("prefetch_bucket_size", "stage3_prefetch_bucket_size");
  STRATA_RETURN_IF_ERROR(r.Int("prefetch_bucket_size", &z->stage3_prefetch_bucket_size, kNonNegative,
                               "stage3_prefetch_bucket_size"));
  z->stage3_param_persistence_threshold_auto =
      r.WasAuto("param_persistence_threshold", "stage3_param_persistence_threshold");
  STRATA_RETURN_IF_ERROR(r.Int("param_persistence_threshold", &z->stage3_param_persistence_threshold,
                               kNonNegative, "stage3_param_persistence_threshold"));
  STRATA_RETURN_IF_ERROR(r.Int("model_persistence_threshold", &z->stage3_model_persistence_threshold,
                               kNonNegative, "stage3_model_persistence_threshold"));
  STRATA_RETURN_IF_ERROR(r.Int("max_live_parameters", &z->stage3_max_live_parameters, kNonNegative,
                               "stage3_max_live_parameters"));
  STRATA_RETURN_IF_ERROR(r.Int("max_reuse_distance", &z->stage3_max_reuse_distance, kNonNegative,
                               "stage3_max_reuse_distance"));
  const bool gather_given =
      r.Given("gather_16bit_weights_on_model_save") || r.Given("stage3_gather_16bit_weights_on_model_save");
  STRATA_RETURN_IF_ERROR(r.Bool("gather_16bit_weights_on_model_save",
                                &z->gather_16bit_weights_on_model_save,
                                "stage3_gather_16bit_weights_on_model_save"));
  int64_t granularity = 0;
  STRATA_RETURN_IF_ERROR(r.Int("module_granularity_threshold", &granularity, kAnyInt,
                               "stage3_module_granularity_threshold"));

  // Deprecated keys, mapped after validation as DeepSpeed maps them.
  bool cpu_offload_param = false, cpu_offload = false;
  STRATA_RETURN_IF_ERROR(ReadDeprecatedOffload(r, "cpu_offload_param", "offload_param",
                                               offload_param_given, warnings, &cpu_offload_param));
  STRATA_RETURN_IF_ERROR(ReadDeprecatedOffload(r, "cpu_offload", "offload_optimizer",
                                               offload_optimizer_given, warnings, &cpu_offload));
  std::optional<bool> pin;
  STRATA_RETURN_IF_ERROR(r.OptBool("cpu_offload_use_pin_memory", &pin, &given));
  if (given) {
    warnings->push_back(absl::StrCat("'", r.PathOf("cpu_offload_use_pin_memory"),
                                     "' is deprecated and DeepSpeed ignores it; set pin_memory in "
                                     "offload_param or offload_optimizer"));
  }
  bool gather_fp16 = false;
  const bool gather_fp16_given = r.Given("stage3_gather_fp16_weights_on_model_save");
  STRATA_RETURN_IF_ERROR(r.Bool("stage3_gather_fp16_weights_on_model_save", &gather_fp16));
  if (gather_fp16_given) {
    if (gather_given) {
      return absl::InvalidArgumentError(
          "zero_optimization.stage3_gather_fp16_weights_on_model_save: the deprecated key and its "
          "replacement 'stage3_gather_16bit_weights_on_model_save' are both given; keep the new one");
    }
    z->gather_16bit_weights_on_model_save = gather_fp16;
    warnings->push_back(
        "'zero_optimization.stage3_gather_fp16_weights_on_model_save' is deprecated; write "
        "'stage3_gather_16bit_weights_on_model_save'");
  }
  STRATA_RETURN_IF_ERROR(r.Finish());

  // DeepSpeedZeroConfig's model validators.
  z->overlap_comm = overlap_comm.value_or(z->stage == 3);
  if (!z->compute_grad_norm && z->stage != 1 && z->stage != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.compute_grad_norm: false is supported only at stage 1 or 2 (stage is ",
        z->stage, ")"));
  }
  if (has_offload_optimizer && z->offload_optimizer.ratio < 1.0 && z->stage != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.offload_optimizer.ratio: ", z->offload_optimizer.ratio,
        " (partial offload) needs stage 3 (stage is ", z->stage, ")"));
  }
  if (cpu_offload_param) {
    z->offload_param = OffloadParamConfig{};
    z->offload_param.device = OffloadDevice::kCpu;
  }
  if (cpu_offload) {
    z->offload_optimizer = OffloadOptimizerConfig{};
    z->offload_optimizer.device = OffloadDevice::kCpu;
  }

  // What DeepSpeed's engine does with the offload settings at this stage.
  if (z->offload_param.device != OffloadDevice::kNone && z->stage != 3) {
    warnings->push_back(absl::StrCat(
        "zero_optimization.offload_param: DeepSpeed ignores parameter offload at stage ", z->stage,
        " (it needs stage 3); planned without it"));
    z->offload_param.device = OffloadDevice::kNone;
    z->offload_param.ignored = true;
  }
  if (z->offload_optimizer.device != OffloadDevice::kNone && z->stage == 0) {
    warnings->push_back(
        "zero_optimization.offload_optimizer: DeepSpeed ignores optimizer offload at stage 0 "
        "(ZeRO is off); planned without it");
    z->offload_optimizer.device = OffloadDevice::kNone;
    z->offload_optimizer.ignored = true;
  }
  if (z->offload_optimizer.device == OffloadDevice::kNvme && z->stage != 3) {
    warnings->push_back(absl::StrCat(
        "zero_optimization.offload_optimizer.device: \"nvme\" at stage ", z->stage,
        " runs as CPU offload in DeepSpeed (NVMe needs stage 3); planned as \"cpu\""));
    z->offload_optimizer.device = OffloadDevice::kCpu;
    z->offload_optimizer.nvme_ran_as_cpu = true;
  }
  for (auto [device, path, name] :
       {std::tuple(z->offload_optimizer.device, &z->offload_optimizer.nvme_path, "offload_optimizer"),
        std::tuple(z->offload_param.device, &z->offload_param.nvme_path, "offload_param")}) {
    if (device == OffloadDevice::kNvme && path->empty()) {
      warnings->push_back(absl::StrCat("zero_optimization.", name,
                                       ".nvme_path is not set; DeepSpeed needs it for \"nvme\" when "
                                       "it swaps (stratad uses its own --nvme_path)"));
    }
  }
  return absl::OkStatus();
}

// aio: DeepSpeed reads it with dict.get and checks nothing but use_gds (which
// needs a CUDA accelerator). strata keeps a value it can use and warns about
// one it cannot, keeping DeepSpeed's default.
absl::Status ReadAio(const Json& value, Warnings* warnings, AioConfig* a) {
  if (!value.is_object()) return InvalidValue("aio", value, "a JSON object");
  auto whole = [&](const char* key, uint64_t min, uint64_t max, auto* out) {
    auto it = value.find(key);
    if (it == value.end()) return;
    std::optional<int64_t> v = it->is_number() ? dsconfig::PyInt(*it) : std::nullopt;
    if (v.has_value() && *v >= static_cast<int64_t>(min) && static_cast<uint64_t>(*v) <= max) {
      *out = static_cast<std::remove_pointer_t<decltype(out)>>(*v);
    } else {
      warnings->push_back(absl::StrCat("aio.", key, ": ", Describe(*it), " is not usable (expected ",
                                       min, "..", max, "); the default is kept"));
    }
  };
  whole("block_size", 512, 1ull << 30, &a->block_size);
  whole("queue_depth", 1, 65536, &a->queue_depth);
  whole("intra_op_parallelism", 1, 1024, &a->intra_op_parallelism);
  for (auto [key, out] : {std::pair("single_submit", &a->single_submit),
                          std::pair("overlap_events", &a->overlap_events),
                          std::pair("use_gds", &a->use_gds)}) {
    if (auto it = value.find(key); it != value.end()) *out = Truthy(*it);
  }
  for (auto it = value.begin(); it != value.end(); ++it) {
    static constexpr const char* kKnown[] = {"block_size", "queue_depth", "intra_op_parallelism",
                                             "single_submit", "overlap_events", "use_gds"};
    if (std::find(std::begin(kKnown), std::end(kKnown), it.key()) == std::end(kKnown)) {
      warnings->push_back(absl::StrCat("unknown key '", dsconfig::JoinPath("aio", it.key()),
                                       "' ignored (DeepSpeed ignores it too)"));
    }
  }
  return absl::OkStatus();
}

// DeepSpeedFP16Config (runtime/precision_config.py).
absl::Status ReadFp16(const Json& value, LossScaleConfig* f) {
  STRATA_ASSIGN_OR_RETURN(ModelReader r, ModelReader::Open(value, "fp16"));
  STRATA_RETURN_IF_ERROR(r.Bool("enabled", &f->enabled));
  STRATA_RETURN_IF_ERROR(r.Bool("auto_cast", &f->auto_cast));
  // loss_scale: float(v), not a bool, finite, >= 0.
  STRATA_ASSIGN_OR_RETURN(const Json* ls, r.Field("loss_scale"));
  if (ls != nullptr) {
    std::optional<double> v = ls->is_boolean() ? std::nullopt : dsconfig::PyFloat(*ls);
    if (!v.has_value() || !std::isfinite(*v) || *v < 0) {
      return InvalidValue(r.PathOf("loss_scale"), *ls, "0 (dynamic) or a positive finite number");
    }
    f->loss_scale = *v;
  }
  int64_t power = f->initial_scale_power;
  STRATA_RETURN_IF_ERROR(r.Int("initial_scale_power", &power, kAnyInt));
  // loss_scale_window and min_loss_scale: int(v) must work on the raw value
  // (so "1000.0" is refused), then pydantic's int.
  int64_t window = f->loss_scale_window, min_scale = 1;
  for (auto [key, out] : {std::pair("loss_scale_window", &window), std::pair("min_loss_scale", &min_scale)}) {
    STRATA_ASSIGN_OR_RETURN(const Json* v, r.Field(key));
    if (v == nullptr) continue;
    const bool int_ok = v->is_number() ? std::isfinite(v->get<double>())
                        : v->is_string() ? dsconfig::PythonIntOfString(v->get<std::string>()).has_value()
                                         : false;
    std::optional<int64_t> i = int_ok ? dsconfig::PyInt(*v) : std::nullopt;
    if (!i.has_value()) return InvalidValue(r.PathOf(key), *v, "an integer");
    *out = *i;
  }
  int64_t hysteresis = f->hysteresis;
  STRATA_RETURN_IF_ERROR(r.Int("hysteresis", &hysteresis, kAnyInt));
  STRATA_RETURN_IF_ERROR(r.Bool("consecutive_hysteresis", &f->consecutive_hysteresis));
  STRATA_RETURN_IF_ERROR(r.Bool("fp16_master_weights_and_grads", &f->fp16_master_weights_and_grads));
  STRATA_RETURN_IF_ERROR(r.Finish());
  const bool dynamic = f->enabled && f->loss_scale == 0;
  if (dynamic && window <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16.loss_scale_window: ", window, " must be > 0 with dynamic loss scaling (loss_scale 0)"));
  }
  if (dynamic && min_scale <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16.min_loss_scale: ", min_scale, " must be > 0 with dynamic loss scaling (loss_scale 0)"));
  }
  // DeepSpeed holds Python ints; strata's loss scaler holds these types. A
  // value beyond them matters only while dynamic scaling runs.
  const bool fits = power >= -1074 && power <= 1023 && window >= 0 && window <= UINT32_MAX &&
                    hysteresis >= 0 && hysteresis <= UINT32_MAX;
  if (!fits && dynamic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16: initial_scale_power ", power, ", loss_scale_window ", window, ", hysteresis ",
        hysteresis, " are beyond what strata's loss scaler holds (power -1074..1023, window and "
        "hysteresis 0..2^32-1)"));
  }
  if (fits) {
    f->initial_scale_power = static_cast<int>(power);
    f->loss_scale_window = static_cast<uint32_t>(window);
    f->hysteresis = static_cast<uint32_t>(hysteresis);
  }
  f->min_loss_scale = static_cast<double>(min_scale);
  return absl::OkStatus();
}

// DeepSpeedBF16Config.
absl::Status ReadBf16(const Json& value, const std::string& path, bool* enabled,
                      bool* master_weights, bool* optimizer_states) {
  STRATA_ASSIGN_OR_RETURN(ModelReader r, ModelReader::Open(value, path));
  bool unused = false;
  STRATA_RETURN_IF_ERROR(r.Bool("enabled", enabled));
  STRATA_RETURN_IF_ERROR(r.Bool("immediate_grad_update", &unused));
  STRATA_RETURN_IF_ERROR(r.Bool("check_grad_overflow", &unused));
  STRATA_RETURN_IF_ERROR(r.Bool("bf16_master_weights_and_grads", master_weights));
  STRATA_RETURN_IF_ERROR(r.Bool("bf16_optimizer_states", optimizer_states));
  return r.Finish();
}

// TPTrainingConfig (runtime/tensor_parallel/config.py).
absl::Status ReadTensorParallel(const Json& value, uint32_t* autotp_size) {
  STRATA_ASSIGN_OR_RETURN(ModelReader r, ModelReader::Open(value, "tensor_parallel"));
  STRATA_ASSIGN_OR_RETURN(const Json* dtype, r.Field("dtype"));
  if (dtype != nullptr) {
    // A torch.dtype object: nothing JSON can hold is one.
    return InvalidValue(r.PathOf("dtype"), *dtype,
                        "no value (DeepSpeed wants a torch.dtype object here, which JSON cannot "
                        "hold; leave it out or write \"auto\")");
  }
  STRATA_RETURN_IF_ERROR(r.Int("autotp_size", autotp_size, kNonNegative));
  bool unused = false;
  bool given = false;
  std::optional<bool> opt;
  std::string text;
  STRATA_RETURN_IF_ERROR(r.Bool("tp_overlap_comm", &unused));
  STRATA_RETURN_IF_ERROR(r.OptBool("vocab_parallel_lm_head", &opt, &given));
  STRATA_RETURN_IF_ERROR(r.Enum("vocab_parallel_ce_backend", &text, {"torch", "liger"}));
  STRATA_ASSIGN_OR_RETURN(const Json* tp, r.Field("tensor_parallel", "tp"));
  if (tp != nullptr) {
    STRATA_ASSIGN_OR_RETURN(ModelReader t, ModelReader::Open(*tp, r.PathOf("tensor_parallel")));
    int64_t n = 0;
    STRATA_RETURN_IF_ERROR(t.Int("tp_size", &n, kAnyInt));
    STRATA_RETURN_IF_ERROR(t.Int("tp_grain_size", &n, kAnyInt));
    STRATA_RETURN_IF_ERROR(t.Any("mpu"));
    STRATA_RETURN_IF_ERROR(t.Any("tp_group"));
    STRATA_RETURN_IF_ERROR(t.Finish());
  }
  STRATA_RETURN_IF_ERROR(r.OptArray("injection_policy_tuple"));
  STRATA_RETURN_IF_ERROR(r.OptObject("partition_config"));
  STRATA_RETURN_IF_ERROR(r.OptString("preset_model", &text));
  STRATA_RETURN_IF_ERROR(r.Bool("keep_module_on_host", &unused));
  STRATA_RETURN_IF_ERROR(r.Bool("replace_with_kernel_inject", &unused, "kernel_inject"));
  return r.Finish();
}

// HybridEngineConfig (runtime/config.py).
absl::Status ReadHybridEngine(const Json& value) {
  STRATA_ASSIGN_OR_RETURN(ModelReader r, ModelReader::Open(value, "hybrid_engine"));
  bool unused = false;
  int64_t n = 0;
  STRATA_RETURN_IF_ERROR(r.Bool("enabled", &unused));
  STRATA_RETURN_IF_ERROR(r.Int("max_out_tokens", &n, kPositive));
  STRATA_RETURN_IF_ERROR(r.Int("inference_tp_size", &n, kAnyInt));
  STRATA_RETURN_IF_ERROR(r.Bool("release_inference_cache", &unused));
  STRATA_RETURN_IF_ERROR(r.Bool("pin_parameters", &unused));
  STRATA_RETURN_IF_ERROR(r.Int("tp_gather_partition_size", &n, kAnyInt));
  STRATA_RETURN_IF_ERROR(r.Bool("enable_cuda_graph", &unused));
  return r.Finish();
}

bool IsTorchOptimClass(absl::string_view name) {
  // torch.optim's optimizer classes in torch 2.15 (what getattr(torch.optim,
  // name) finds; DeepSpeed looks torch names up case-sensitively).
  static constexpr const char* kTorch[] = {"ASGD",    "Adadelta", "Adafactor", "Adagrad",
                                           "Adam",    "AdamW",    "Adamax",    "LBFGS",
                                           "Muon",    "NAdam",    "RAdam",     "RMSprop",
                                           "Rprop",   "SGD",      "SparseAdam"};
  return std::find(std::begin(kTorch), std::end(kTorch), name) != std::end(kTorch);
}

bool IsDeepSpeedOptimizer(absl::string_view lower) {
  static constexpr const char* kDeepSpeed[] = {"adagrad", "adam",    "adamw", "lamb", "muadam",
                                               "muadamw", "musgd",   "lion",  "muon"};
  return std::find(std::begin(kDeepSpeed), std::end(kDeepSpeed), lower) != std::end(kDeepSpeed);
}

// optimizer: DeepSpeed keeps "type" (a string, any name) and hands "params"
// to the optimizer's constructor unchecked, so strata refuses only what
// DeepSpeed's parser refuses and records params it cannot use.
absl::Status ReadOptimizer(const Json& value, Warnings* warnings, std::optional<OptimizerConfig>* out) {
  if (!value.is_object()) return InvalidValue("optimizer", value, "a JSON object");
  auto type_it = value.find("type");
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (it.key() != "type" && it.key() != "params" && it.key() != "legacy_fusion") {
      warnings->push_back(absl::StrCat("unknown key '", dsconfig::JoinPath("optimizer", it.key()),
                                       "' ignored (DeepSpeed ignores it too)"));
    }
  }
  if (type_it == value.end() || type_it->is_null()) return absl::OkStatus();  // the trainer's own
  if (!type_it->is_string()) return InvalidValue("optimizer.type", *type_it, "an optimizer name (a string)");
  OptimizerConfig o;
  o.type = type_it->get<std::string>();
  const std::string lower = absl::AsciiStrToLower(o.type);
  if (lower == "adam") o.kind = OptimizerKind::kAdam;
  else if (lower == "adamw") o.kind = OptimizerKind::kAdamW;
  else if (lower == "adagrad") o.kind = OptimizerKind::kAdagrad;
  else if (lower == "lion") o.kind = OptimizerKind::kLion;
  else if (lower == "lamb") o.kind = OptimizerKind::kLamb;
  else o.kind = OptimizerKind::kOther;
  if (!IsDeepSpeedOptimizer(lower) && !IsTorchOptimClass(o.type)) {
    warnings->push_back(absl::StrCat(
        "optimizer.type: '", dsconfig::PrintableKey(o.type),
        "' is neither a DeepSpeed optimizer nor a torch.optim class; deepspeed.initialize will "
        "not find it"));
  }
  // Defaults of the optimizers DeepSpeed builds for these names (FusedAdam,
  // DeepSpeedCPUAdagrad, FusedLamb, FusedLion/DeepSpeedCPULion: lr 1e-3,
  // betas (0.9, 0.999); Adagrad lr 1e-2, eps 1e-10).
  if (o.kind == OptimizerKind::kAdagrad) {
    o.lr = 1e-2;
    o.eps = 1e-10;
  }
  bool adam_w_mode = true;
  auto params_it = value.find("params");
  if (params_it != value.end() && !params_it->is_null()) {
    if (!params_it->is_object()) return InvalidValue("optimizer.params", *params_it, "a JSON object");
    const Json& p = *params_it;
    auto number = [&](const char* key, double* dst, bool* was_auto = nullptr) {
      auto it = p.find(key);
      if (it == p.end()) return;
      if (IsAuto(*it)) {
        if (was_auto != nullptr) *was_auto = true;
        return;
      }
      if (it->is_number() && std::isfinite(it->get<double>())) {
        *dst = it->get<double>();
      } else {
        o.unusable.push_back(absl::StrCat("optimizer.params.", key, ": ", Describe(*it),
                                          " is not a finite number"));
      }
    };
    auto boolean = [&](const char* key, bool* dst) {
      auto it = p.find(key);
      if (it == p.end()) return;
      if (it->is_boolean()) *dst = it->get<bool>();
      else o.unusable.push_back(absl::StrCat("optimizer.params.", key, ": ", Describe(*it), " is not true or false"));
    };
    number("lr", &o.lr, &o.lr_auto);
    if (auto it = p.find("betas"); it != p.end() && !IsAuto(*it)) {
      if (it->is_array() && it->size() == 2 && (*it)[0].is_number() && (*it)[1].is_number() &&
          std::isfinite((*it)[0].get<double>()) && std::isfinite((*it)[1].get<double>())) {
        o.betas = {(*it)[0].get<double>(), (*it)[1].get<double>()};
      } else {
        o.unusable.push_back(absl::StrCat("optimizer.params.betas: ", Describe(*it),
                                          " is not two numbers, e.g. [0.9, 0.999]"));
      }
    }
    number("eps", &o.eps);
    number("weight_decay", &o.weight_decay);
    boolean("amsgrad", &o.amsgrad);
    boolean("adam_w_mode", &adam_w_mode);
    number("lr_decay", &o.lr_decay);
    number("initial_accumulator_value", &o.initial_accumulator_value);
    // _do_warning_check compares max_grad_norm with 0: a value Python cannot
    // compare with a number is an error there.
    if (auto it = p.find("max_grad_norm"); it != p.end()) {
      if (!it->is_number() && !it->is_boolean()) {
        return InvalidValue("optimizer.params.max_grad_norm", *it, "a number");
      }
      if (Truthy(*it) && (it->is_boolean() || it->get<double>() > 0)) {
        warnings->push_back(
            "optimizer.params.max_grad_norm is not supported by DeepSpeed as an optimizer "
            "parameter; use the top-level 'gradient_clipping'");
      }
    }
    for (const Json* v : {&p}) {
      for (auto it = v->begin(); it != v->end(); ++it) {
        if (!it->is_number() || std::isfinite(it->get<double>())) continue;
        if (it.key() == "max_grad_norm") continue;
        o.unusable.push_back(absl::StrCat("optimizer.params.", dsconfig::PrintableKey(it.key()),
                                          ": not a finite number"));
      }
    }
  }
  if (o.kind == OptimizerKind::kAdam && adam_w_mode) o.kind = OptimizerKind::kAdamW;
  *out = std::move(o);
  return absl::OkStatus();
}

// Batch sizes: DeepSpeed derives the missing one of train_batch_size =
// micro_batch * gradient_accumulation_steps * world_size and asserts the
// equation. strata does not know the world size here, so it checks what
// holds for every world size (positive whole numbers, and a train_batch_size
// that some world size makes consistent) and leaves the rest to DeepSpeed.
absl::Status ReadBatch(const Json& root, Warnings* warnings, DeepSpeedConfig* c) {
  struct Entry {
    const char* key;
    std::optional<uint64_t> value;
    bool is_auto = false;
  };
  Entry e[3] = {{"train_batch_size", std::nullopt, false},
                {"train_micro_batch_size_per_gpu", std::nullopt, false},
                {"gradient_accumulation_steps", std::nullopt, false}};
  for (Entry& entry : e) {
    auto it = root.find(entry.key);
    if (it == root.end() || it->is_null()) continue;
    if (IsAuto(*it)) {
      entry.is_auto = true;  // the Hugging Face integration fills it in
      continue;
    }
    std::optional<int64_t> v = it->is_number() ? dsconfig::PyInt(*it) : std::nullopt;
    if (!v.has_value() || *v <= 0) return InvalidValue(entry.key, *it, "a whole number > 0");
    entry.value = static_cast<uint64_t>(*v);
  }
  const auto& [tb, mb, gas] = e;
  c->train_batch_size = tb.value;
  c->train_micro_batch_size_per_gpu = mb.value;
  if (gas.value.has_value()) {
    c->gradient_accumulation_steps = *gas.value;
    c->gradient_accumulation_steps_given = true;
  }
  if (!tb.value && !tb.is_auto && !mb.value && !mb.is_auto) {
    warnings->push_back(
        "neither train_batch_size nor train_micro_batch_size_per_gpu is set; DeepSpeed refuses "
        "such a config at deepspeed.initialize");
  }
  if (tb.value && mb.value) {
    const uint64_t per_world = *mb.value * gas.value.value_or(1);
    if (per_world / *mb.value != gas.value.value_or(1) || *tb.value % per_world != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "train_batch_size ", *tb.value, " is not train_micro_batch_size_per_gpu ", *mb.value,
          " x gradient_accumulation_steps ", gas.value.value_or(1),
          " x world_size for any world size"));
    }
  } else if (tb.value && gas.value && *tb.value % *gas.value != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train_batch_size ", *tb.value, " is not a multiple of gradient_accumulation_steps ",
        *gas.value));
  }
  return absl::OkStatus();
}

// The top-level keys DeepSpeed checks with plain Python (runtime/config.py).
absl::Status ReadPlainChecks(const Json& root, int stage, bool zenflow) {
  for (const char* key : {"communication_data_type", "seq_parallel_communication_data_type"}) {
    auto it = root.find(key);
    if (it == root.end() || it->is_null()) continue;
    const std::string lower = it->is_string() ? absl::AsciiStrToLower(it->get<std::string>()) : "";
    if (lower != "fp32" && lower != "fp16" && lower != "bf16") {
      return InvalidValue(key, *it, "one of \"fp32\", \"fp16\", \"bf16\"");
    }
  }
  if (auto it = root.find("gradient_allreduce_op"); it != root.end()) {
    const std::string lower = it->is_string() ? absl::AsciiStrToLower(it->get<std::string>()) : "";
    if (lower != "mean" && lower != "sum") {
      return InvalidValue("gradient_allreduce_op", *it, "\"mean\" or \"sum\"");
    }
    if (lower == "sum" && (stage == 3 || zenflow)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient_allreduce_op: \"sum\" is not supported with ", stage == 3 ? "ZeRO stage 3" : "ZenFlow"));
    }
  }
  if (auto it = root.find("checkpoint"); it != root.end()) {
    if (!it->is_object()) return InvalidValue("checkpoint", *it, "a JSON object");
    if (auto tv = it->find("tag_validation"); tv != it->end()) {
      const std::string upper = tv->is_string() ? absl::AsciiStrToUpper(tv->get<std::string>()) : "";
      if (upper != "WARN" && upper != "IGNORE" && upper != "FAIL") {
        return InvalidValue("checkpoint.tag_validation", *tv, "one of \"WARN\", \"IGNORE\", \"FAIL\"");
      }
    }
    if (auto pw = it->find("parallel_write"); pw != it->end()) {
      if (!pw->is_object()) return InvalidValue("checkpoint.parallel_write", *pw, "a JSON object");
      if (auto ps = pw->find("pipeline_stage"); ps != pw->end()) {
        // Python's `in [True, False]`: 0, 1, 0.0 and 1.0 pass too.
        const bool ok = ps->is_boolean() ||
                        (ps->is_number() && (ps->get<double>() == 0 || ps->get<double>() == 1));
        if (!ok) return InvalidValue("checkpoint.parallel_write.pipeline_stage", *ps, "true or false");
      }
    }
  }
  if (auto it = root.find("data_types"); it != root.end()) {
    if (!it->is_object()) return InvalidValue("data_types", *it, "a JSON object");
    if (auto k = it->find("keep_in_fp32_modules"); k != it->end() && !IsAuto(*k)) {
      bool ok = k->is_array();
      if (ok) {
        for (const Json& name : *k) ok = ok && name.is_string();
      }
      if (!ok) return InvalidValue("data_types.keep_in_fp32_modules", *k, "\"auto\" or a list of name patterns");
    }
  }
  if (auto it = root.find("torch_autocast"); it != root.end()) {
    if (!it->is_object()) return InvalidValue("torch_autocast", *it, "a JSON object");
    if (auto d = it->find("dtype"); d != it->end()) {
      static constexpr const char* kDtypes[] = {
          "torch.float16", "fp16", "float16", "half", "torch.float32", "fp32", "float32", "float",
          "torch.int8", "int8", "torch.bfloat16", "bf16", "bfloat16"};
      const bool ok = d->is_string() && std::find(std::begin(kDtypes), std::end(kDtypes),
                                                  d->get<std::string>()) != std::end(kDtypes);
      if (!ok) return InvalidValue("torch_autocast.dtype", *d, "a dtype name such as \"bfloat16\"");
    }
    if (auto m = it->find("lower_precision_safe_modules"); m != it->end()) {
      // all(isinstance(x, str) for x in value): a string or an object (its
      // keys) passes, as in Python.
      bool ok = m->is_string() || m->is_object() || m->is_array();
      if (m->is_array()) {
        for (const Json& name : *m) ok = ok && name.is_string();
      }
      if (!ok) {
        return InvalidValue("torch_autocast.lower_precision_safe_modules", *m, "a list of module names");
      }
    }
  }
  // DeepSpeed computes `wall_clock_breakdown | flops_profiler.enabled` and
  // `vocabulary_size % 8`: values Python cannot do that with fail there.
  if (auto it = root.find("wall_clock_breakdown"); it != root.end()) {
    if (!it->is_boolean() && !it->is_number_integer()) {
      return InvalidValue("wall_clock_breakdown", *it, "true or false");
    }
  }
  if (auto it = root.find("vocabulary_size"); it != root.end()) {
    if (Truthy(*it) && !it->is_number() && !it->is_boolean()) {
      return InvalidValue("vocabulary_size", *it, "a number");
    }
  }
  // Sections DeepSpeed opens with dict methods or **: anything but an object
  // fails there.
  for (const char* key : {"scheduler", "pipeline", "compile", "weight_quantization"}) {
    auto it = root.find(key);
    if (it != root.end() && !it->is_object()) return InvalidValue(key, *it, "a JSON object");
  }
  return absl::OkStatus();
}

// The path of the first number literal beyond a double (see
// ParseConfigJson), walking with an explicit stack (the depth is capped, but
// nothing here recurses anyway); empty when there is none.
std::string FindOverflow(const Json& root) {
  std::vector<std::pair<const Json*, std::string>> stack = {{&root, ""}};
  while (!stack.empty()) {
    auto [v, path] = std::move(stack.back());
    stack.pop_back();
    if (dsconfig::IsOverflow(*v)) return path.empty() ? "the config" : path;
    if (v->is_object()) {
      for (auto it = v->begin(); it != v->end(); ++it) {
        stack.emplace_back(&it.value(), dsconfig::JoinPath(path, it.key()));
      }
    } else if (v->is_array()) {
      for (size_t i = 0; i < v->size(); ++i) stack.emplace_back(&(*v)[i], absl::StrCat(path, "[", i, "]"));
    }
  }
  return "";
}

}  // namespace

absl::string_view OffloadDeviceName(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone: return "none";
    case OffloadDevice::kCpu: return "cpu";
    case OffloadDevice::kNvme: return "nvme";
  }
  return "unknown";
}

absl::string_view OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kAdamW: return "adamw";
    case OptimizerKind::kAdagrad: return "adagrad";
    case OptimizerKind::kLion: return "lion";
    case OptimizerKind::kLamb: return "lamb";
    case OptimizerKind::kOther: return "other";
  }
  return "unknown";
}

absl::StatusOr<DeepSpeedConfig> ParseDeepSpeedConfig(absl::string_view json_text) {
  STRATA_ASSIGN_OR_RETURN(Json root, dsconfig::ParseConfigJson(json_text, kMaxDeepSpeedConfigDepth));
  if (!root.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the config: expected a JSON object, got ", Describe(root)));
  }
  for (const auto& [key, why] : kRemovedTopLevel) {
    if (root.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", key, "': ", why, "; DeepSpeed 0.19.8 refuses this key (see ", kRemovedIssue, ")"));
    }
  }
  auto zero_it = root.find("zero_optimization");
  if (zero_it != root.end() && zero_it->is_object()) {
    for (const auto& [key, why] : kRemovedZero) {
      if (zero_it->contains(key)) {
        return absl::InvalidArgumentError(absl::StrCat("'zero_optimization.", key, "': ", why,
                                                       "; DeepSpeed 0.19.8 refuses this key (see ",
                                                       kRemovedIssue, ")"));
      }
    }
  }
  DeepSpeedConfig config;
  Warnings* warnings = &config.warnings;
  STRATA_RETURN_IF_ERROR(ReadBatch(root, warnings, &config));
  if (zero_it != root.end()) {
    STRATA_RETURN_IF_ERROR(ReadZero(*zero_it, root, warnings, &config.zero));
  }
  if (auto it = root.find("gradient_clipping"); it != root.end() && !IsAuto(*it)) {
    if (!it->is_number() || !std::isfinite(it->get<double>())) {
      return InvalidValue("gradient_clipping", *it, "a finite number (0 or less: off)");
    }
    config.gradient_clipping = it->get<double>();
    config.gradient_clipping_given = true;
  }
  if (auto it = root.find("fp16"); it != root.end()) {
    STRATA_RETURN_IF_ERROR(ReadFp16(*it, &config.fp16));
  }
  // "bf16" wins; its old name "bfloat16" is read only when bf16 is absent or null.
  bool bf16_master = false, bf16_states = false;
  auto bf16_it = root.find("bf16");
  if (bf16_it == root.end() || bf16_it->is_null()) bf16_it = root.find("bfloat16");
  if (bf16_it != root.end()) {
    STRATA_RETURN_IF_ERROR(
        ReadBf16(*bf16_it, bf16_it.key(), &config.bf16_enabled, &bf16_master, &bf16_states));
  }
  if (config.fp16.enabled && config.bf16_enabled) {
    return absl::InvalidArgumentError(
        "fp16.enabled and bf16.enabled are both true; DeepSpeed allows at most one");
  }
  if (auto it = root.find("optimizer"); it != root.end()) {
    STRATA_RETURN_IF_ERROR(ReadOptimizer(*it, warnings, &config.optimizer));
  }
  if (auto it = root.find("aio"); it != root.end() && !it->is_null()) {
    STRATA_RETURN_IF_ERROR(ReadAio(*it, warnings, &config.aio));
  }
  if (auto it = root.find("tensor_parallel"); it != root.end()) {
    STRATA_RETURN_IF_ERROR(ReadTensorParallel(*it, &config.tensor_parallel_autotp_size));
  }
  if (auto it = root.find("hybrid_engine"); it != root.end()) {
    STRATA_RETURN_IF_ERROR(ReadHybridEngine(*it));
  }
  const bool zenflow = zero_it != root.end() && zero_it->is_object() &&
                       zero_it->contains("zenflow") && !(*zero_it)["zenflow"].is_null() &&
                       !IsAuto((*zero_it)["zenflow"]);
  STRATA_RETURN_IF_ERROR(ReadPlainChecks(root, config.zero.stage, zenflow));
  // _do_error_check: master weights in 16 bits need ZeRO.
  const int stage = config.zero.stage;
  if (config.fp16.fp16_master_weights_and_grads && stage == 0) {
    return absl::InvalidArgumentError(
        "fp16.fp16_master_weights_and_grads needs ZeRO stage 1, 2 or 3");
  }
  if (bf16_master && stage == 0) {
    return absl::InvalidArgumentError("bf16.bf16_master_weights_and_grads needs ZeRO stage 1, 2 or 3");
  }
  if (bf16_states && (stage == 0 || !bf16_master)) {
    return absl::InvalidArgumentError(
        "bf16.bf16_optimizer_states needs ZeRO stage 1, 2 or 3 and bf16_master_weights_and_grads");
  }
  // DeepSpeed loads a config file with hjson, which refuses a number beyond
  // a double wherever it is; where strata reads the key it has said so above.
  if (std::string where = FindOverflow(root); !where.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": a number beyond the range of a double; DeepSpeed's config loader refuses it"));
  }
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (std::find_if(std::begin(kKnownTopLevel), std::end(kKnownTopLevel),
                     [&](const char* k) { return it.key() == k; }) == std::end(kKnownTopLevel)) {
      warnings->push_back(absl::StrCat("unknown key '", dsconfig::JoinPath("", it.key()),
                                       "' ignored (DeepSpeed ignores it too)"));
    }
  }
  return config;
}

absl::StatusOr<DeepSpeedConfig> LoadDeepSpeedConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("DeepSpeed config '", path, "' cannot be opened; check the path"));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto config = ParseDeepSpeedConfig(buffer.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace strata
