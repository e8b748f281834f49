#include "daemon/job_request_json.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata {
namespace {

// Left out at its default, as proto3's JSON printer did (-0.0 is written).
bool IsDefault(double v) { return v == 0 && !std::signbit(v); }

nlohmann::json Real(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

struct Bad {
  std::string message;
};

std::string Shown(const nlohmann::json& v) { return v.dump().substr(0, 64); }

uint64_t Whole(const nlohmann::json& v, const std::string& field, uint64_t max) {
  uint64_t out = 0;
  bool ok = false;
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    ok = true;
  } else if (v.is_number_integer()) {
    ok = v.get<int64_t>() >= 0;
    out = static_cast<uint64_t>(v.get<int64_t>());
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    ok = d >= 0 && d < 18446744073709551616.0 && std::floor(d) == d;
    if (ok) out = static_cast<uint64_t>(d);
  } else if (v.is_string()) {
    ok = absl::SimpleAtoi(v.get<std::string>(), &out);
  }
  if (!ok || out > max) {
    throw Bad{absl::StrCat(field, " is ", Shown(v), "; expected a whole number in 0..", max)};
  }
  return out;
}

double RealFrom(const nlohmann::json& v, const std::string& field) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    double d = 0;
    if (absl::SimpleAtod(s, &d)) return d;
  }
  throw Bad{absl::StrCat(field, " is ", Shown(v), "; expected a number")};
}

std::string Text(const nlohmann::json& v, const std::string& field) {
  if (!v.is_string()) throw Bad{absl::StrCat(field, " is ", Shown(v), "; expected a string")};
  return v.get<std::string>();
}

bool Flag(const nlohmann::json& v, const std::string& field) {
  if (!v.is_boolean()) throw Bad{absl::StrCat(field, " is ", Shown(v), "; expected true or false")};
  return v.get<bool>();
}

// "worldSize" and "world_size" name the same field.
std::string SnakeCase(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c >= 'A' && c <= 'Z') {
      out += '_';
      out += static_cast<char>(c - 'A' + 'a');
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<JobMode> ModeFrom(const nlohmann::json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "MODE_OFFLOAD") return JobMode::kOffload;
    if (s == "MODE_INFINITY") return JobMode::kInfinity;
    if (s == "MODE_UNSPECIFIED") return std::nullopt;
  } else if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > INT32_MAX)) {
    const int64_t n = v.get<int64_t>();
    if (n == 1) return JobMode::kOffload;
    if (n == 2) return JobMode::kInfinity;
    if (n >= std::numeric_limits<int32_t>::min() && n <= std::numeric_limits<int32_t>::max()) return std::nullopt;
  }
  throw Bad{absl::StrCat("mode is ", Shown(v), "; expected MODE_OFFLOAD or MODE_INFINITY")};
}

JobRequest::Optimizer OptimizerFrom(const nlohmann::json& o) {
  if (!o.is_object()) throw Bad{absl::StrCat("optimizer is ", Shown(o), "; expected an object")};
  JobRequest::Optimizer out;
  for (const auto& [key, v] : o.items()) {
    const std::string name = SnakeCase(key);
    if (v.is_null()) continue;  // the default
    if (name == "type") out.type = Text(v, "optimizer.type");
    else if (name == "lr") out.lr = RealFrom(v, "optimizer.lr");
    else if (name == "beta1") out.beta1 = RealFrom(v, "optimizer.beta1");
    else if (name == "beta2") out.beta2 = RealFrom(v, "optimizer.beta2");
    else if (name == "eps") out.eps = RealFrom(v, "optimizer.eps");
    else if (name == "weight_decay") out.weight_decay = RealFrom(v, "optimizer.weight_decay");
    else if (name == "amsgrad") out.amsgrad = Flag(v, "optimizer.amsgrad");
    else if (name == "lr_decay") out.lr_decay = RealFrom(v, "optimizer.lr_decay");
    else if (name == "initial_accumulator_value") {
      out.initial_accumulator_value = RealFrom(v, "optimizer.initial_accumulator_value");
    } else {
      throw Bad{absl::StrCat("optimizer has an unknown field '", key.substr(0, 64), "'")};
    }
  }
  return out;
}

}  // namespace

nlohmann::json JobRequestToJson(const JobRequest& r) {
  nlohmann::json j = nlohmann::json::object();
  if (!r.name.empty()) j["name"] = r.name;
  if (r.world_size != 0) j["worldSize"] = r.world_size;
  if (r.mode.has_value()) j["mode"] = *r.mode == JobMode::kInfinity ? "MODE_INFINITY" : "MODE_OFFLOAD";
  if (!r.deepspeed_config_json.empty()) j["deepspeedConfigJson"] = r.deepspeed_config_json;
  if (r.optimizer.has_value()) {
    const JobRequest::Optimizer& o = *r.optimizer;
    nlohmann::json oj = nlohmann::json::object();
    if (!o.type.empty()) oj["type"] = o.type;
    const std::pair<const char*, double> reals[] = {{"lr", o.lr},
                                                    {"beta1", o.beta1},
                                                    {"beta2", o.beta2},
                                                    {"eps", o.eps},
                                                    {"weightDecay", o.weight_decay},
                                                    {"lrDecay", o.lr_decay},
                                                    {"initialAccumulatorValue", o.initial_accumulator_value}};
    for (const auto& [key, v] : reals) {
      if (!IsDefault(v)) oj[key] = Real(v);
    }
    if (o.amsgrad) oj["amsgrad"] = true;
    j["optimizer"] = std::move(oj);
  }
  if (!r.param_dtype.empty()) j["paramDtype"] = r.param_dtype;
  if (!r.grad_dtype.empty()) j["gradDtype"] = r.grad_dtype;
  if (r.pinned_budget_bytes != 0) j["pinnedBudgetBytes"] = std::to_string(r.pinned_budget_bytes);
  if (r.device_budget_bytes != 0) j["deviceBudgetBytes"] = std::to_string(r.device_budget_bytes);
  if (!r.local_ranks.empty()) j["localRanks"] = r.local_ranks;
  if (r.external_step_agreement) j["externalStepAgreement"] = true;
  return j;
}

absl::StatusOr<JobRequest> JobRequestFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("job settings are not a JSON object");
  try {
    JobRequest r;
    for (const auto& [key, v] : j.items()) {
      const std::string name = SnakeCase(key);
      if (v.is_null()) continue;  // the default
      if (name == "name") r.name = Text(v, "name");
      else if (name == "world_size") r.world_size = static_cast<uint32_t>(Whole(v, "world_size", UINT32_MAX));
      else if (name == "mode") r.mode = ModeFrom(v);
      else if (name == "deepspeed_config_json") r.deepspeed_config_json = Text(v, "deepspeed_config_json");
      else if (name == "optimizer") r.optimizer = OptimizerFrom(v);
      else if (name == "param_dtype") r.param_dtype = Text(v, "param_dtype");
      else if (name == "grad_dtype") r.grad_dtype = Text(v, "grad_dtype");
      else if (name == "pinned_budget_bytes") r.pinned_budget_bytes = Whole(v, "pinned_budget_bytes", UINT64_MAX);
      else if (name == "device_budget_bytes") r.device_budget_bytes = Whole(v, "device_budget_bytes", UINT64_MAX);
      else if (name == "attach_if_exists") (void)Flag(v, "attach_if_exists");  // how to create, not the job
      else if (name == "local_ranks") {
        if (!v.is_array()) throw Bad{absl::StrCat("local_ranks is ", Shown(v), "; expected an array")};
        for (const auto& rank : v) {
          r.local_ranks.push_back(static_cast<uint32_t>(Whole(rank, "local_ranks", UINT32_MAX)));
        }
      } else if (name == "external_step_agreement") {
        r.external_step_agreement = Flag(v, "external_step_agreement");
      } else {
        throw Bad{absl::StrCat("unknown field '", key.substr(0, 64), "'")};
      }
    }
    return r;
  } catch (const Bad& bad) {
    return absl::InvalidArgumentError(bad.message);
  }
}

}  // namespace strata
