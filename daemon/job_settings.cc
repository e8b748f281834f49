#include "daemon/job_settings.h"

#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/byte_size.h"
#include "core/status_macros.h"

namespace strata {
namespace {

// An optimizer as a job names it: the kind it parsed to (kOther for a name
// stratad does not know), the name as written and the field it came from.
struct NamedOptimizer {
  OptimizerKind kind = OptimizerKind::kAdam;
  std::string type;
  std::string field;
  bool from_config = false;
};

// The optimizer the job would run: the request's when it names one (it
// overrides the config's), else the config's; nullopt when neither names
// one (Adam with its defaults).
std::optional<NamedOptimizer> OptimizerToRun(const JobRequest& r, const DeepSpeedConfig& ds) {
  if (r.optimizer.has_value() && !r.optimizer->type.empty()) {
    // An unknown name is refused by CheckStratadRuns with the list of what
    // stratad runs, not ParseOptimizerKind's list (which includes LAMB).
    absl::StatusOr<OptimizerKind> kind = ParseOptimizerKind(r.optimizer->type);
    return NamedOptimizer{kind.ok() ? *kind : OptimizerKind::kOther, r.optimizer->type, "optimizer.type", false};
  }
  if (ds.optimizer.has_value()) {
    return NamedOptimizer{ds.optimizer->kind, ds.optimizer->type, "deepspeed_config_json: optimizer.type", true};
  }
  return std::nullopt;
}

// stratad runs only the optimizers it steps shard by shard. LAMB has a CPU
// kernel (optimizer_cpu/lamb.h), but its trust ratio needs each tensor's
// whole norms, and a ZeRO shard (or an NVMe tile of one) holds pieces of
// tensors: the daemon does not gather those norms across shards and ranks
// yet, and stepping LAMB per piece would be silently wrong, so it refuses it.
absl::Status CheckStratadRuns(const NamedOptimizer& o) {
  if (o.kind != OptimizerKind::kLamb && o.kind != OptimizerKind::kOther) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      o.field, " '", o.type.substr(0, 100),
      "' is not an optimizer stratad runs; stratad supports Adam, AdamW, Adagrad and Lion "
      "(LAMB needs per-tensor trust ratios across shards, not built yet); name one of those in ", o.field,
      o.from_config ? " (`strata plan` still plans this config)" : ""));
}

// The request's hyperparameters over the config's (`kind` is the request's,
// already checked).
void ApplyRequestOptimizer(const JobRequest::Optimizer& o, OptimizerKind kind, OptimizerHyperparams& h) {
  h.kind = kind;
  h.lr = o.lr;
  if (o.beta1 != 0 || o.beta2 != 0) {
    h.beta1 = o.beta1;
    h.beta2 = o.beta2;
  }
  if (o.eps != 0) h.eps = o.eps;
  h.weight_decay = o.weight_decay;
  h.amsgrad = o.amsgrad;
  h.lr_decay = o.lr_decay;
  h.initial_accumulator_value = o.initial_accumulator_value;
}

// The most pinned_budget_bytes may be: 1 PiB, far above any host's memory
// (and the ceiling of max_region_bytes, daemon/daemon_config.cc), and far
// below 2^64, so the window's sizes (the budget plus its staging) cannot
// wrap. A budget under it is still admitted against --pinned_capacity.
constexpr uint64_t kMaxPinnedBudgetBytes = uint64_t{1} << 50;

absl::Status CheckPinnedBudget(uint64_t pinned_budget_bytes) {
  if (pinned_budget_bytes <= kMaxPinnedBudgetBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "pinned_budget_bytes ", pinned_budget_bytes, " is above the ceiling of ", FormatBytes(kMaxPinnedBudgetBytes),
      " (", kMaxPinnedBudgetBytes, " bytes); ask for at most the pinned memory the job's window needs, within the "
      "daemon's --pinned_capacity (or 0 to let the daemon size it)"));
}

}  // namespace

absl::StatusOr<JobSettings> ResolveJobSettings(const JobRequest& r) {
  JobSettings s;
  s.name = r.name;
  if (s.name.empty() || s.name.size() > 128) {
    return absl::InvalidArgumentError("job name must be 1..128 characters");
  }
  for (char c : s.name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') {
      return absl::InvalidArgumentError(absl::StrCat(
          "job name '", s.name, "' may only hold letters, digits, '-', '_' and '.'"));
    }
  }
  if (r.world_size < 1 || r.world_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size ", r.world_size, " is not valid; expected 1..4096"));
  }
  s.world_size = r.world_size;
  if (!r.mode.has_value()) {
    return absl::InvalidArgumentError("mode must be MODE_OFFLOAD or MODE_INFINITY");
  }
  s.mode = *r.mode;
  s.deepspeed_config_json = r.deepspeed_config_json.empty() ? "{}" : r.deepspeed_config_json;
  auto ds = ParseDeepSpeedConfig(s.deepspeed_config_json);
  if (!ds.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("deepspeed_config_json: ", ds.status().message()));
  }
  s.warnings = ds->warnings;
  s.stage = ds->zero.stage;
  if (s.mode == JobMode::kOffload && (s.stage < 1 || s.stage > 2)) {
    // Offload keeps the flat stage-1/2 layout; stage 0 has nothing partitioned.
    if (s.stage == 0) s.stage = 2;
    else if (s.stage == 3) {
      return absl::InvalidArgumentError(
          "zero_optimization.stage 3 needs mode MODE_INFINITY (params partitioned per tensor and "
          "swapped); use stage 1 or 2 for MODE_OFFLOAD");
    }
  }
  if (s.mode == JobMode::kInfinity) {
    if (s.stage != 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "MODE_INFINITY needs zero_optimization.stage 3 (the config says ", s.stage, ")"));
    }
  }
  // The request's optimizer overrides the config's; whichever names the one
  // the job runs is checked once, here, so neither source can slip one past.
  const std::optional<NamedOptimizer> named = OptimizerToRun(r, *ds);
  if (named.has_value()) STRATA_RETURN_IF_ERROR(CheckStratadRuns(*named));
  s.optimizer = ds->optimizer.has_value() ? HyperparamsFromDeepSpeed(*ds->optimizer) : OptimizerHyperparams{};
  const bool request_names_optimizer = r.optimizer.has_value() && !r.optimizer->type.empty();
  if (ds->optimizer.has_value() && !request_names_optimizer && !ds->optimizer->unusable.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("deepspeed_config_json: ", absl::StrJoin(ds->optimizer->unusable, "; ")));
  }
  if (request_names_optimizer) ApplyRequestOptimizer(*r.optimizer, named->kind, s.optimizer);
  if (absl::Status v = ValidateOptimizerHyperparams(s.optimizer); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer: ", v.message()));
  }
  auto dtype = [](const std::string& text, DType fallback, const char* field) -> absl::StatusOr<DType> {
    if (text.empty()) return fallback;
    auto d = ParseDType(text);
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat(field, ": ", d.status().message()));
    return *d;
  };
  const DType natural = ds->bf16_enabled ? DType::kBf16 : ds->fp16.enabled ? DType::kFp16 : DType::kFp32;
  STRATA_ASSIGN_OR_RETURN(s.param_dtype, dtype(r.param_dtype, natural, "param_dtype"));
  STRATA_ASSIGN_OR_RETURN(s.grad_dtype, dtype(r.grad_dtype, natural, "grad_dtype"));
  s.loss_scale = ds->fp16;
  s.gradient_clipping = ds->gradient_clipping;
  s.sub_group_size = ds->zero.sub_group_size;
  STRATA_RETURN_IF_ERROR(CheckPinnedBudget(r.pinned_budget_bytes));
  s.pinned_budget_bytes = r.pinned_budget_bytes;
  s.device_budget_bytes = r.device_budget_bytes;
  s.local_ranks = r.local_ranks;
  std::sort(s.local_ranks.begin(), s.local_ranks.end());
  for (size_t i = 0; i < s.local_ranks.size(); ++i) {
    if (s.local_ranks[i] >= s.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("local_ranks: rank ", s.local_ranks[i],
                                                     " is out of range for world size ", s.world_size));
    }
    if (i > 0 && s.local_ranks[i] == s.local_ranks[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat("local_ranks: rank ", s.local_ranks[i], " is listed twice"));
    }
  }
  s.external_step_agreement = r.external_step_agreement;
  return s;
}

bool JobSettings::IsLocal(uint32_t rank) const {
  return local_ranks.empty() || std::binary_search(local_ranks.begin(), local_ranks.end(), rank);
}

JobRequest JobSettingsToRequest(const JobSettings& s) {
  JobRequest r;
  r.name = s.name;
  r.world_size = s.world_size;
  r.mode = s.mode;
  r.deepspeed_config_json = s.deepspeed_config_json;
  JobRequest::Optimizer& o = r.optimizer.emplace();
  o.type = std::string(OptimizerKindName(s.optimizer.kind));
  o.lr = s.optimizer.lr;
  o.beta1 = s.optimizer.beta1;
  o.beta2 = s.optimizer.beta2;
  o.eps = s.optimizer.eps;
  o.weight_decay = s.optimizer.weight_decay;
  o.amsgrad = s.optimizer.amsgrad;
  o.lr_decay = s.optimizer.lr_decay;
  o.initial_accumulator_value = s.optimizer.initial_accumulator_value;
  r.param_dtype = std::string(DTypeName(s.param_dtype));
  r.grad_dtype = std::string(DTypeName(s.grad_dtype));
  r.pinned_budget_bytes = s.pinned_budget_bytes;
  r.device_budget_bytes = s.device_budget_bytes;
  r.local_ranks = s.local_ranks;
  r.external_step_agreement = s.external_step_agreement;
  return r;
}

}  // namespace strata
