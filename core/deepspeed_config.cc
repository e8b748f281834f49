#include "core/deepspeed_config.h"

#include <cmath>
#include <fstream>
#include <initializer_list>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

using Json = nlohmann::json;

bool IsAuto(const Json& value) { return value.is_string() && value.get<std::string>() == "auto"; }

// Walks one JSON object, remembering which keys were read so the rest can be
// reported as unknown with their full path.
class ObjectReader {
 public:
  ObjectReader(const Json& object, std::string path, std::vector<std::string>* warnings)
      : object_(object), path_(std::move(path)), warnings_(warnings) {}

  static absl::StatusOr<ObjectReader> Open(const Json& value, std::string path,
                                           std::vector<std::string>* warnings) {
    if (!value.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path.empty() ? "the config" : path, ": expected a JSON object, got ",
                       value.type_name()));
    }
    return ObjectReader(value, std::move(path), warnings);
  }

  std::string PathOf(absl::string_view key) const {
    return path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key);
  }

  // Returns the value under `key`, or nullptr when absent or null.
  const Json* Find(absl::string_view key) {
    known_.insert(std::string(key));
    auto it = object_.find(std::string(key));
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  void Accept(std::initializer_list<absl::string_view> keys) {
    for (absl::string_view k : keys) known_.insert(std::string(k));
  }

  absl::Status Bool(absl::string_view key, bool* out, bool* was_auto = nullptr) {
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (IsAuto(*v) && was_auto != nullptr) {
      *was_auto = true;
      return absl::OkStatus();
    }
    if (!v->is_boolean()) return Invalid(key, *v, "true or false");
    *out = v->get<bool>();
    return absl::OkStatus();
  }

  absl::Status Number(absl::string_view key, double* out, double min, double max,
                      absl::string_view accepted, bool* was_auto = nullptr) {
    const Json* v = nullptr;
    double value = 0;
    STRATA_RETURN_IF_ERROR(ReadNumber(key, accepted, was_auto, &v, &value));
    if (v == nullptr) return absl::OkStatus();
    if (value < min || value > max) return Invalid(key, *v, accepted);
    *out = value;
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Whole(absl::string_view key, T* out, uint64_t min, uint64_t max,
                     bool* was_auto = nullptr) {
    std::string accepted =
        min == 0 ? "a non-negative whole number" : absl::StrCat("a whole number >= ", min);
    if (max < UINT64_MAX / 2) absl::StrAppend(&accepted, " and <= ", max);
    const Json* v = nullptr;
    double value = 0;
    STRATA_RETURN_IF_ERROR(ReadNumber(key, accepted, was_auto, &v, &value));
    if (v == nullptr) return absl::OkStatus();
    if (value < static_cast<double>(min) || value > static_cast<double>(max) ||
        value != std::floor(value)) {
      return Invalid(key, *v, accepted);
    }
    *out = static_cast<T>(value);
    return absl::OkStatus();
  }

  absl::Status String(absl::string_view key, std::string* out) {
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_string()) return Invalid(key, *v, "a string");
    *out = v->get<std::string>();
    return absl::OkStatus();
  }

  absl::Status Invalid(absl::string_view key, const Json& value, absl::string_view accepted) {
    return absl::InvalidArgumentError(absl::StrCat(PathOf(key), ": ", value.dump(),
                                                   " is not valid; expected ", accepted));
  }

  // Reads `key` as a finite number, written as a JSON number or a numeric
  // string ("5e8"). Sets *found to the value's node, or leaves it null when
  // the key is absent or "auto" (then *was_auto, when given, is set).
  absl::Status ReadNumber(absl::string_view key, absl::string_view accepted, bool* was_auto,
                          const Json** found, double* value) {
    const Json* v = Find(key);
    if (v == nullptr) return absl::OkStatus();
    if (IsAuto(*v) && was_auto != nullptr) {
      *was_auto = true;
      return absl::OkStatus();
    }
    if (v->is_number()) {
      *value = v->get<double>();
    } else if (!(v->is_string() && absl::SimpleAtod(v->get<std::string>(), value))) {
      return Invalid(key, *v, accepted);
    }
    if (!std::isfinite(*value)) return Invalid(key, *v, accepted);
    *found = v;
    return absl::OkStatus();
  }

  void WarnUnknown() {
    for (auto it = object_.begin(); it != object_.end(); ++it) {
      if (!known_.contains(it.key())) {
        warnings_->push_back(absl::StrCat("unknown key '", PathOf(it.key()), "' ignored"));
      }
    }
  }

 private:
  const Json& object_;
  std::string path_;
  std::vector<std::string>* warnings_;
  absl::flat_hash_set<std::string> known_;
};

absl::Status ReadOffloadDevice(ObjectReader& r, OffloadDevice* out) {
  std::string text;
  STRATA_RETURN_IF_ERROR(r.String("device", &text));
  if (text.empty()) return absl::OkStatus();
  std::string lower = absl::AsciiStrToLower(text);
  if (lower == "none") *out = OffloadDevice::kNone;
  else if (lower == "cpu") *out = OffloadDevice::kCpu;
  else if (lower == "nvme") *out = OffloadDevice::kNvme;
  else return r.Invalid("device", Json(text), "one of \"none\", \"cpu\", \"nvme\"");
  return absl::OkStatus();
}

absl::Status ReadOffloadOptimizer(const Json& value, const std::string& path,
                                  std::vector<std::string>* warnings, OffloadOptimizerConfig* c) {
  STRATA_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::Open(value, path, warnings));
  STRATA_RETURN_IF_ERROR(ReadOffloadDevice(r, &c->device));
  STRATA_RETURN_IF_ERROR(r.String("nvme_path", &c->nvme_path));
  STRATA_RETURN_IF_ERROR(r.Bool("pin_memory", &c->pin_memory));
  STRATA_RETURN_IF_ERROR(r.Whole("buffer_count", &c->buffer_count, 1, 1024));
  STRATA_RETURN_IF_ERROR(r.Bool("pipeline_read", &c->pipeline_read));
  STRATA_RETURN_IF_ERROR(r.Bool("pipeline_write", &c->pipeline_write));
  STRATA_RETURN_IF_ERROR(r.Number("ratio", &c->ratio, 1e-9, 1.0, "a fraction in (0, 1]"));
  r.Accept({"fast_init", "pipeline"});
  if (c->device == OffloadDevice::kNvme && c->nvme_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        r.PathOf("nvme_path"), ": required when device is \"nvme\"; name a directory on an NVMe drive"));
  }
  r.WarnUnknown();
  return absl::OkStatus();
}

absl::Status ReadOffloadParam(const Json& value, const std::string& path,
                              std::vector<std::string>* warnings, OffloadParamConfig* c) {
  STRATA_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::Open(value, path, warnings));
  STRATA_RETURN_IF_ERROR(ReadOffloadDevice(r, &c->device));
  STRATA_RETURN_IF_ERROR(r.String("nvme_path", &c->nvme_path));
  STRATA_RETURN_IF_ERROR(r.Whole("buffer_count", &c->buffer_count, 1, 1024));
  STRATA_RETURN_IF_ERROR(r.Whole("buffer_size", &c->buffer_size, 1, UINT64_MAX / 4));
  STRATA_RETURN_IF_ERROR(r.Whole("max_in_cpu", &c->max_in_cpu, 0, UINT64_MAX / 4));
  STRATA_RETURN_IF_ERROR(r.Bool("pin_memory", &c->pin_memory));
  if (c->device == OffloadDevice::kNvme && c->nvme_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        r.PathOf("nvme_path"), ": required when device is \"nvme\"; name a directory on an NVMe drive"));
  }
  r.WarnUnknown();
  return absl::OkStatus();
}

absl::Status ReadZero(const Json& value, std::vector<std::string>* warnings, ZeroConfig* z) {
  STRATA_ASSIGN_OR_RETURN(ObjectReader r,
                          ObjectReader::Open(value, "zero_optimization", warnings));
  if (const Json* stage = r.Find("stage"); stage != nullptr) {
    if (!stage->is_number_integer() || stage->get<int64_t>() < 0 || stage->get<int64_t>() > 3) {
      return r.Invalid("stage", *stage, "one of 0, 1, 2, 3");
    }
    z->stage = static_cast<int>(stage->get<int64_t>());
  }
  z->overlap_comm = z->stage == 3;  // DeepSpeed's stage-dependent default
  if (const Json* v = r.Find("offload_optimizer"); v != nullptr) {
    STRATA_RETURN_IF_ERROR(ReadOffloadOptimizer(*v, r.PathOf("offload_optimizer"), warnings,
                                                &z->offload_optimizer));
  }
  if (const Json* v = r.Find("offload_param"); v != nullptr) {
    STRATA_RETURN_IF_ERROR(
        ReadOffloadParam(*v, r.PathOf("offload_param"), warnings, &z->offload_param));
  }
  // Old spellings (DeepSpeed < 0.5): cpu_offload / cpu_offload_params.
  bool cpu_offload = false, cpu_offload_params = false;
  STRATA_RETURN_IF_ERROR(r.Bool("cpu_offload", &cpu_offload));
  STRATA_RETURN_IF_ERROR(r.Bool("cpu_offload_params", &cpu_offload_params));
  if (cpu_offload && z->offload_optimizer.device == OffloadDevice::kNone) {
    z->offload_optimizer.device = OffloadDevice::kCpu;
  }
  if (cpu_offload_params && z->offload_param.device == OffloadDevice::kNone) {
    z->offload_param.device = OffloadDevice::kCpu;
  }
  constexpr uint64_t kMax = UINT64_MAX / 4;
  STRATA_RETURN_IF_ERROR(r.Whole("sub_group_size", &z->sub_group_size, 1, kMax));
  STRATA_RETURN_IF_ERROR(r.Whole("stage3_prefetch_bucket_size", &z->stage3_prefetch_bucket_size,
                                 0, kMax, &z->stage3_prefetch_bucket_size_auto));
  STRATA_RETURN_IF_ERROR(
      r.Whole("stage3_max_live_parameters", &z->stage3_max_live_parameters, 0, kMax));
  STRATA_RETURN_IF_ERROR(
      r.Whole("stage3_max_reuse_distance", &z->stage3_max_reuse_distance, 0, kMax));
  STRATA_RETURN_IF_ERROR(r.Whole("stage3_param_persistence_threshold",
                                 &z->stage3_param_persistence_threshold, 0, kMax,
                                 &z->stage3_param_persistence_threshold_auto));
  STRATA_RETURN_IF_ERROR(r.Bool("overlap_comm", &z->overlap_comm));
  STRATA_RETURN_IF_ERROR(r.Bool("contiguous_gradients", &z->contiguous_gradients));
  STRATA_RETURN_IF_ERROR(r.Whole("reduce_bucket_size", &z->reduce_bucket_size, 1, kMax,
                                 &z->reduce_bucket_size_auto));
  // DeepSpeed keys that shape its own communication, not strata's store.
  r.Accept({"allgather_partitions", "allgather_bucket_size", "reduce_scatter",
            "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
            "round_robin_gradients", "zero_hpz_partition_size", "zero_quantized_weights",
            "zero_quantized_gradients", "memory_efficient_linear", "load_from_fp32_weights",
            "elastic_checkpoint", "ignore_unused_parameters", "legacy_stage1",
            "use_multi_rank_bucket_allreduce", "mics_shard_size", "mics_hierarchical_params_gather",
            "offload_optimizer_config", "stage3_module_granularity_threshold"});
  if (z->offload_param.device != OffloadDevice::kNone && z->stage != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.offload_param: requires stage 3 (stage is ", z->stage,
        "); set \"stage\": 3 or remove offload_param"));
  }
  if (z->offload_optimizer.device != OffloadDevice::kNone && z->stage == 0) {
    return absl::InvalidArgumentError(
        "zero_optimization.offload_optimizer: requires stage 1, 2 or 3 (stage is 0)");
  }
  if (z->offload_optimizer.device == OffloadDevice::kNvme && z->stage != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero_optimization.offload_optimizer.device: \"nvme\" requires stage 3 (stage is ",
        z->stage, "); use \"cpu\" or set \"stage\": 3"));
  }
  r.WarnUnknown();
  return absl::OkStatus();
}

absl::Status ReadAio(const Json& value, std::vector<std::string>* warnings, AioConfig* a) {
  STRATA_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::Open(value, "aio", warnings));
  STRATA_RETURN_IF_ERROR(r.Whole("block_size", &a->block_size, 512, 1ull << 30));
  if ((a->block_size & (a->block_size - 1)) != 0 || a->block_size % 512 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "aio.block_size: ", a->block_size, " is not valid; expected a power of two >= 512"));
  }
  STRATA_RETURN_IF_ERROR(r.Whole("queue_depth", &a->queue_depth, 1, 65536));
  // intra_op_parallelism wins over its old name thread_count when both are set.
  STRATA_RETURN_IF_ERROR(r.Whole("thread_count", &a->intra_op_parallelism, 1, 1024));
  STRATA_RETURN_IF_ERROR(r.Whole("intra_op_parallelism", &a->intra_op_parallelism, 1, 1024));
  STRATA_RETURN_IF_ERROR(r.Bool("single_submit", &a->single_submit));
  STRATA_RETURN_IF_ERROR(r.Bool("overlap_events", &a->overlap_events));
  r.Accept({"use_gds"});
  r.WarnUnknown();
  return absl::OkStatus();
}

absl::Status ReadFp16(const Json& value, std::vector<std::string>* warnings, LossScaleConfig* f) {
  STRATA_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::Open(value, "fp16", warnings));
  bool enabled_auto = false;
  STRATA_RETURN_IF_ERROR(r.Bool("enabled", &f->enabled, &enabled_auto));
  STRATA_RETURN_IF_ERROR(r.Number("loss_scale", &f->loss_scale, 0, 1e30,
                                  "0 (dynamic) or a positive loss scale"));
  STRATA_RETURN_IF_ERROR(r.Whole("initial_scale_power", &f->initial_scale_power, 0, 64));
  STRATA_RETURN_IF_ERROR(r.Whole("loss_scale_window", &f->loss_scale_window, 1, 1u << 30));
  STRATA_RETURN_IF_ERROR(r.Whole("hysteresis", &f->hysteresis, 1, 1u << 30));
  STRATA_RETURN_IF_ERROR(
      r.Number("min_loss_scale", &f->min_loss_scale, 1e-30, 1e30, "a positive number"));
  r.Accept({"auto_cast", "consecutive_hysteresis", "fp16_master_weights_and_grads", "type"});
  r.WarnUnknown();
  return absl::OkStatus();
}

absl::Status ReadOptimizer(const Json& value, std::vector<std::string>* warnings,
                           OptimizerConfig* o) {
  STRATA_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::Open(value, "optimizer", warnings));
  std::string type;
  STRATA_RETURN_IF_ERROR(r.String("type", &type));
  std::string lower = absl::AsciiStrToLower(type);
  // DeepSpeed's "Adam" runs in AdamW mode unless adam_w_mode is false.
  bool adam_w_mode = true;
  if (lower == "adam") o->kind = OptimizerKind::kAdam;
  else if (lower == "adamw") o->kind = OptimizerKind::kAdamW;
  else if (lower == "adagrad") o->kind = OptimizerKind::kAdagrad;
  else if (lower == "lion") o->kind = OptimizerKind::kLion;
  else {
    return r.Invalid("type", Json(type), "one of \"Adam\", \"AdamW\", \"Adagrad\", \"Lion\"");
  }
  if (o->kind == OptimizerKind::kLion) o->betas = {0.9, 0.99};
  if (o->kind == OptimizerKind::kAdagrad) o->lr = 1e-2;
  if (o->kind == OptimizerKind::kAdagrad) o->eps = 1e-10;
  if (const Json* params = r.Find("params"); params != nullptr) {
    STRATA_ASSIGN_OR_RETURN(ObjectReader p, ObjectReader::Open(*params, "optimizer.params", warnings));
    bool unused_auto = false;
    STRATA_RETURN_IF_ERROR(p.Number("lr", &o->lr, 0, 1e6, "a non-negative learning rate", &o->lr_auto));
    if (const Json* betas = p.Find("betas"); betas != nullptr && !IsAuto(*betas)) {
      if (!betas->is_array() || betas->size() != 2 || !(*betas)[0].is_number() ||
          !(*betas)[1].is_number()) {
        return p.Invalid("betas", *betas, "two numbers in [0, 1), e.g. [0.9, 0.999]");
      }
      for (int i = 0; i < 2; ++i) {
        double b = (*betas)[i].get<double>();
        if (!(b >= 0 && b < 1)) return p.Invalid("betas", *betas, "two numbers in [0, 1)");
        o->betas[i] = b;
      }
    }
    STRATA_RETURN_IF_ERROR(p.Number("eps", &o->eps, 0, 1, "a small non-negative number", &unused_auto));
    STRATA_RETURN_IF_ERROR(p.Number("weight_decay", &o->weight_decay, 0, 1e6,
                                    "a non-negative number", &unused_auto));
    STRATA_RETURN_IF_ERROR(p.Bool("amsgrad", &o->amsgrad));
    STRATA_RETURN_IF_ERROR(p.Bool("adam_w_mode", &adam_w_mode));
    STRATA_RETURN_IF_ERROR(p.Number("lr_decay", &o->lr_decay, 0, 1e6, "a non-negative number"));
    STRATA_RETURN_IF_ERROR(p.Number("initial_accumulator_value", &o->initial_accumulator_value,
                                    0, 1e30, "a non-negative number"));
    p.Accept({"torch_adam", "bias_correction", "fused", "foreach", "capturable", "maximize",
              "differentiable"});
    p.WarnUnknown();
  }
  if (o->kind == OptimizerKind::kAdam && adam_w_mode) o->kind = OptimizerKind::kAdamW;
  r.Accept({"legacy_fusion"});
  r.WarnUnknown();
  return absl::OkStatus();
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
  }
  return "unknown";
}

absl::StatusOr<DeepSpeedConfig> ParseDeepSpeedConfig(absl::string_view json_text) {
  // nlohmann reports the position of a syntax error only through its
  // exception; it is caught here and never crosses our API.
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/true,
                       /*ignore_comments=*/true);
  } catch (const Json::parse_error& e) {
    return absl::InvalidArgumentError(absl::StrCat("DeepSpeed config is not valid JSON: ", e.what()));
  }
  DeepSpeedConfig config;
  STRATA_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::Open(root, "", &config.warnings));
  if (const Json* v = r.Find("zero_optimization"); v != nullptr) {
    STRATA_RETURN_IF_ERROR(ReadZero(*v, &config.warnings, &config.zero));
  }
  if (const Json* v = r.Find("aio"); v != nullptr) {
    STRATA_RETURN_IF_ERROR(ReadAio(*v, &config.warnings, &config.aio));
  }
  if (const Json* v = r.Find("fp16"); v != nullptr) {
    STRATA_RETURN_IF_ERROR(ReadFp16(*v, &config.warnings, &config.fp16));
  }
  if (const Json* v = r.Find("bf16"); v != nullptr) {
    STRATA_ASSIGN_OR_RETURN(ObjectReader b, ObjectReader::Open(*v, "bf16", &config.warnings));
    bool unused_auto = false;
    STRATA_RETURN_IF_ERROR(b.Bool("enabled", &config.bf16_enabled, &unused_auto));
    b.Accept({"immediate_grad_update", "check_grad_overflow"});
    b.WarnUnknown();
  }
  if (config.fp16.enabled && config.bf16_enabled) {
    return absl::InvalidArgumentError(
        "fp16.enabled and bf16.enabled are both true; enable at most one");
  }
  if (const Json* v = r.Find("optimizer"); v != nullptr) {
    OptimizerConfig optimizer;
    STRATA_RETURN_IF_ERROR(ReadOptimizer(*v, &config.warnings, &optimizer));
    config.optimizer = optimizer;
  }
  bool unused_auto = false;
  STRATA_RETURN_IF_ERROR(r.Number("gradient_clipping", &config.gradient_clipping, 0, 1e30,
                                  "0 (off) or a positive max norm", &unused_auto));
  uint64_t micro_batch = 0;
  bool micro_batch_auto = false;
  if (r.Find("train_micro_batch_size_per_gpu") != nullptr) {
    STRATA_RETURN_IF_ERROR(r.Whole("train_micro_batch_size_per_gpu", &micro_batch, 1,
                                   UINT32_MAX, &micro_batch_auto));
    if (!micro_batch_auto) config.train_micro_batch_size_per_gpu = micro_batch;
  }
  STRATA_RETURN_IF_ERROR(r.Whole("gradient_accumulation_steps",
                                 &config.gradient_accumulation_steps, 1, UINT32_MAX, &unused_auto));
  // DeepSpeed keys outside strata's concern.
  r.Accept({"train_batch_size", "scheduler", "steps_per_print", "wall_clock_breakdown",
            "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "activation_checkpointing",
            "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comms_logger",
            "communication_data_type", "prescale_gradients", "gradient_predivide_factor",
            "sparse_gradients", "amp", "data_types", "dump_state", "memory_breakdown",
            "checkpoint", "elasticity", "autotuning", "compression_training", "data_efficiency",
            "pipeline", "seq_parallel_communication_data_type", "torch_autocast", "timers",
            "disable_allgather", "fp32_reduce_scatter", "nebula", "monitor_config"});
  r.WarnUnknown();
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
