#include "daemon/job_record.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"

namespace strata {

std::string SerializeJobRecord(const JobRecord& record, const std::string& format) {
  nlohmann::json r;
  if (!format.empty()) r["format"] = format;
  std::string settings_json;
  (void)google::protobuf::util::MessageToJsonString(record.settings, &settings_json);
  r["settings"] = nlohmann::json::parse(settings_json);
  r["tensors"] = nlohmann::json::array();
  for (size_t i = 0; i < record.tensors.size(); ++i) {
    const TensorSpec& t = record.tensors[i];
    nlohmann::json entry = {{"name", t.name}, {"numel", t.numel}};
    if (i < record.groups.size()) entry["group"] = record.groups[i];
    r["tensors"].push_back(std::move(entry));
  }
  if (!record.group_hyperparams.empty()) {
    r["group_hyperparams"] = nlohmann::json::array();
    for (const strata::v1::GroupHyperparams& g : record.group_hyperparams) {
      r["group_hyperparams"].push_back({{"lr", g.lr()},
                                        {"beta1", g.beta1()},
                                        {"beta2", g.beta2()},
                                        {"eps", g.eps()},
                                        {"weight_decay", g.weight_decay()},
                                        {"lr_decay", g.lr_decay()}});
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
  nlohmann::json r = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (r.is_discarded() || !r.is_object()) return absl::DataLossError(absl::StrCat(what, " is not valid JSON"));
  if (!format.empty() && r.value("format", "") != format) {
    return absl::DataLossError(absl::StrCat(what, " is not a ", format, " record"));
  }
  // nlohmann reports missing or mistyped fields by exception; it stays here.
  try {
    JobRecord record;
    if (!google::protobuf::util::JsonStringToMessage(r.at("settings").dump(), &record.settings).ok()) {
      return absl::DataLossError(absl::StrCat(what, " has unreadable job settings"));
    }
    for (const auto& t : r.at("tensors")) {
      record.tensors.push_back(TensorSpec{TensorId(static_cast<uint32_t>(record.tensors.size())),
                                          t.at("name").get<std::string>(), t.at("numel").get<uint64_t>()});
      // Records written before param groups existed have no "group".
      record.groups.push_back(t.value("group", 0u));
    }
    if (r.contains("group_hyperparams")) {
      for (const auto& g : r.at("group_hyperparams")) {
        strata::v1::GroupHyperparams hp;
        hp.set_lr(g.at("lr").get<double>());
        hp.set_beta1(g.at("beta1").get<double>());
        hp.set_beta2(g.at("beta2").get<double>());
        hp.set_eps(g.at("eps").get<double>());
        hp.set_weight_decay(g.at("weight_decay").get<double>());
        hp.set_lr_decay(g.at("lr_decay").get<double>());
        record.group_hyperparams.push_back(hp);
      }
    }
    if (r.contains("partitions")) {
      for (const auto& rank : r.at("partitions")) {
        std::vector<ShardLayout> shards;
        for (const auto& s : rank) {
          ShardLayout shard;
          shard.index = s.at("index").get<uint32_t>();
          shard.padded_numel = s.at("padded_numel").get<uint64_t>();
          for (const auto& o : s.at("ranges")) {
            shard.ranges.push_back(OwnedRange{TensorId(o.at(0).get<uint32_t>()), o.at(1).get<uint64_t>(),
                                              o.at(2).get<uint64_t>(), o.at(3).get<uint64_t>()});
          }
          shards.push_back(std::move(shard));
        }
        record.partitions.push_back(std::move(shards));
      }
    }
    record.next_step = r.at("next_step").get<uint64_t>();
    record.optimizer_steps = r.at("optimizer_steps").get<uint64_t>();
    const auto& ls = r.at("loss_scaler");
    record.loss_scaler.scale = ls.at("scale").get<double>();
    record.loss_scaler.hysteresis_left = ls.at("hysteresis_left").get<uint32_t>();
    record.loss_scaler.iteration = ls.at("iteration").get<uint64_t>();
    record.loss_scaler.last_overflow_iteration = ls.at("last_overflow_iteration").get<uint64_t>();
    record.loss_scaler.any_overflow = ls.at("any_overflow").get<bool>();
    return record;
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(what, " is malformed: ", e.what()));
  }
}

}  // namespace strata
