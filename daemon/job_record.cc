#include "daemon/job_record.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/job_request_json.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

// A record nests four levels (partitions: ranks, shards, ranges, a range);
// settings hold a DeepSpeed config as a string. Deeper input is refused
// before anything recursive (nlohmann's parser and dump) sees it.
constexpr int kMaxRecordDepth = 32;

// The deepest [ / { nesting of `text`, outside strings; stops counting past `cap`.
int NestingDepth(const std::string& text, int cap) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
      if (deepest > cap) return deepest;
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// A field that is not a whole number in range: nlohmann's get<> would cast a
// float (1e300, UB) or wrap a negative or too-large number silently.
struct FieldError {
  std::string message;
};

template <typename T>
T Whole(const nlohmann::json& value, const char* field) {
  if (value.is_number_unsigned()) {
    const uint64_t v = value.get<uint64_t>();
    if (v <= std::numeric_limits<T>::max()) return static_cast<T>(v);
  } else if (value.is_number_integer()) {
    const int64_t v = value.get<int64_t>();
    if (v >= 0 && static_cast<uint64_t>(v) <= std::numeric_limits<T>::max()) return static_cast<T>(v);
  }
  throw FieldError{absl::StrCat(field, " is ", value.dump().substr(0, 64), "; expected a whole number in 0..",
                                std::numeric_limits<T>::max())};
}

double Real(const nlohmann::json& value, const char* field) {
  if (!value.is_number()) throw FieldError{absl::StrCat(field, " is not a number")};
  return value.get<double>();
}

}  // namespace

std::string SerializeJobRecord(const JobRecord& record, const std::string& format) {
  nlohmann::json r;
  if (!format.empty()) r["format"] = format;
  // "settings" keeps the form it always had (daemon/job_request_json.h), so
  // old records and old daemons agree.
  r["settings"] = JobRequestToJson(record.settings);
  r["tensors"] = nlohmann::json::array();
  for (size_t i = 0; i < record.tensors.size(); ++i) {
    const TensorSpec& t = record.tensors[i];
    nlohmann::json entry = {{"name", t.name}, {"numel", t.numel}};
    if (i < record.groups.size()) entry["group"] = record.groups[i];
    r["tensors"].push_back(std::move(entry));
  }
  if (!record.group_hyperparams.empty()) {
    r["group_hyperparams"] = nlohmann::json::array();
    for (const GroupHyperparams& g : record.group_hyperparams) {
      r["group_hyperparams"].push_back({{"lr", g.lr},
                                        {"beta1", g.beta1},
                                        {"beta2", g.beta2},
                                        {"eps", g.eps},
                                        {"weight_decay", g.weight_decay},
                                        {"lr_decay", g.lr_decay}});
    }
  }
  if (!record.partitions.empty()) {
    r["partitions"] = nlohmann::json::array();
    for (const std::vector<ShardLayout>& rank : record.partitions) {
      nlohmann::json shards = nlohmann::json::array();
      for (const ShardLayout& shard : rank) {
        nlohmann::json ranges = nlohmann::json::array();
        for (const OwnedRange& o : shard.ranges) {
          ranges.push_back({o.tensor.value(), o.tensor_offset, o.numel, o.shard_offset});
        }
        shards.push_back({{"index", shard.index}, {"padded_numel", shard.padded_numel}, {"ranges", ranges}});
      }
      r["partitions"].push_back(std::move(shards));
    }
  }
  r["next_step"] = record.next_step;
  r["optimizer_steps"] = record.optimizer_steps;
  if (record.owner_uid.has_value()) r["owner_uid"] = *record.owner_uid;
  const LossScalerState& ls = record.loss_scaler;
  r["loss_scaler"] = {{"scale", ls.scale},
                      {"hysteresis_left", ls.hysteresis_left},
                      {"iteration", ls.iteration},
                      {"last_overflow_iteration", ls.last_overflow_iteration},
                      {"any_overflow", ls.any_overflow}};
  return r.dump(2);
}

absl::StatusOr<JobRecord> ParseJobRecord(const std::string& text, const std::string& what,
                                         const std::string& format) {
  if (NestingDepth(text, kMaxRecordDepth) > kMaxRecordDepth) {
    return absl::DataLossError(absl::StrCat(what, " nests deeper than ", kMaxRecordDepth, " levels"));
  }
  nlohmann::json r = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (r.is_discarded() || !r.is_object()) return absl::DataLossError(absl::StrCat(what, " is not valid JSON"));
  if (!format.empty()) {
    // Checked by type first: nlohmann's value() throws when "format" is there
    // but not a string (the record fuzzer's find; outside the try below).
    const auto it = r.find("format");
    if (it == r.end() || !it->is_string() || it->get<std::string>() != format) {
      return absl::DataLossError(absl::StrCat(what, " is not a ", format, " record"));
    }
  }
  // nlohmann reports missing or mistyped fields by exception; it stays here.
  try {
    JobRecord record;
    absl::StatusOr<JobRequest> settings = JobRequestFromJson(r.at("settings"));
    if (!settings.ok()) {
      return absl::DataLossError(absl::StrCat(what, " has unreadable job settings: ", settings.status().message()));
    }
    record.settings = std::move(*settings);
    for (const auto& t : r.at("tensors")) {
      record.tensors.push_back(TensorSpec{TensorId(static_cast<uint32_t>(record.tensors.size())),
                                          t.at("name").get<std::string>(), Whole<uint64_t>(t.at("numel"), "numel")});
      // Records written before param groups existed have no "group".
      record.groups.push_back(t.contains("group") ? Whole<uint32_t>(t.at("group"), "group") : 0u);
    }
    if (r.contains("group_hyperparams")) {
      for (const auto& g : r.at("group_hyperparams")) {
        GroupHyperparams hp;
        hp.lr = Real(g.at("lr"), "lr");
        hp.beta1 = Real(g.at("beta1"), "beta1");
        hp.beta2 = Real(g.at("beta2"), "beta2");
        hp.eps = Real(g.at("eps"), "eps");
        hp.weight_decay = Real(g.at("weight_decay"), "weight_decay");
        hp.lr_decay = Real(g.at("lr_decay"), "lr_decay");
        record.group_hyperparams.push_back(hp);
      }
    }
    if (r.contains("partitions")) {
      for (const auto& rank : r.at("partitions")) {
        std::vector<ShardLayout> shards;
        for (const auto& s : rank) {
          ShardLayout shard;
          shard.index = Whole<uint32_t>(s.at("index"), "index");
          shard.padded_numel = Whole<uint64_t>(s.at("padded_numel"), "padded_numel");
          for (const auto& o : s.at("ranges")) {
            shard.ranges.push_back(OwnedRange{TensorId(Whole<uint32_t>(o.at(0), "range tensor")),
                                              Whole<uint64_t>(o.at(1), "range tensor_offset"),
                                              Whole<uint64_t>(o.at(2), "range numel"),
                                              Whole<uint64_t>(o.at(3), "range shard_offset")});
          }
          shards.push_back(std::move(shard));
        }
        record.partitions.push_back(std::move(shards));
      }
    }
    record.next_step = Whole<uint64_t>(r.at("next_step"), "next_step");
    record.optimizer_steps = Whole<uint64_t>(r.at("optimizer_steps"), "optimizer_steps");
    if (r.contains("owner_uid")) record.owner_uid = Whole<uint32_t>(r.at("owner_uid"), "owner_uid");
    const auto& ls = r.at("loss_scaler");
    record.loss_scaler.scale = Real(ls.at("scale"), "loss_scaler.scale");
    record.loss_scaler.hysteresis_left = Whole<uint32_t>(ls.at("hysteresis_left"), "loss_scaler.hysteresis_left");
    record.loss_scaler.iteration = Whole<uint64_t>(ls.at("iteration"), "loss_scaler.iteration");
    record.loss_scaler.last_overflow_iteration =
        Whole<uint64_t>(ls.at("last_overflow_iteration"), "loss_scaler.last_overflow_iteration");
    record.loss_scaler.any_overflow = ls.at("any_overflow").get<bool>();
    return record;
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(what, " is malformed: ", e.what()));
  } catch (const FieldError& e) {
    return absl::DataLossError(absl::StrCat(what, " is malformed: ", e.message));
  }
}

}  // namespace strata
