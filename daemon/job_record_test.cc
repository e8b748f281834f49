// ParseJobRecord refuses what the fuzzer found (daemon/fuzz/job_record_fuzz):
// numbers that are not whole or out of range (a float cast to an integer is
// undefined behaviour) and nesting deep enough to overflow the stack.
#include "daemon/job_record.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/job_proto.h"
#include "daemon/job_request_json.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

std::string Record(const std::string& numel, const std::string& next_step = "1") {
  return absl::StrCat(R"({"settings": {"name": "j", "worldSize": 1, "mode": "MODE_OFFLOAD"},
    "tensors": [{"name": "w", "numel": )", numel, R"(}], "next_step": )", next_step, R"(, "optimizer_steps": 1,
    "loss_scaler": {"scale": 1.0, "hysteresis_left": 2, "iteration": 0, "last_overflow_iteration": 0,
                    "any_overflow": false}})");
}

TEST(JobRecordTest, RoundTrips) {
  auto r = ParseJobRecord(Record("300"), "rec");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tensors.at(0).numel, 300u);
  auto again = ParseJobRecord(SerializeJobRecord(*r, "fmt"), "rec", "fmt");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(SerializeJobRecord(*again), SerializeJobRecord(*r));
}

TEST(JobRecordTest, RefusesNumbersThatAreNotWholeOrInRange) {
  for (const std::string bad : {"1e300", "-5", "2.5", "\"7\"", "true"}) {
    auto r = ParseJobRecord(Record(bad), "the record");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("numel"), std::string::npos) << r.status();
  }
  EXPECT_FALSE(ParseJobRecord(Record("1", "-1"), "the record").ok());
  EXPECT_FALSE(ParseJobRecord(Record("1", "1e30"), "the record").ok());
}

TEST(JobRecordTest, RefusesDeepNestingWithoutRecursing) {
  const int depth = 200000;
  std::string deep = absl::StrCat(R"({"settings": )", std::string(depth, '['), std::string(depth, ']'), "}");
  auto r = ParseJobRecord(deep, "the record");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nests deeper"), std::string::npos) << r.status();
  // Brackets inside strings are not nesting.
  EXPECT_TRUE(ParseJobRecord(Record("1").insert(1, R"("note": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", )"),
                             "rec").ok());
}

// The fuzzer's find in CI: a "format" that is not a string made nlohmann
// throw outside the parser's try (the daemon would abort on such a record).
TEST(JobRecordTest, AFormatThatIsNotAStringIsRefused) {
  for (const std::string format : {R"({"name": "inf"})", "[1]", "7", "null", "true"}) {
    auto r = ParseJobRecord(Record("1").insert(1, absl::StrCat(R"("format": )", format, ", ")), "the record", "fmt");
    ASSERT_FALSE(r.ok()) << format;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    EXPECT_NE(r.status().message().find("is not a fmt record"), std::string::npos) << r.status();
  }
  auto wrong = ParseJobRecord(Record("1").insert(1, R"("format": "other", )"), "the record", "fmt");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kDataLoss);
}

// A record as earlier daemons wrote it (the settings are CreateJobRequest's
// proto3 JSON: camelCase keys, 64-bit numbers as strings, the mode by name)
// reads into the daemon's own types, and is written back in the same form.
constexpr char kEarlierRecord[] = R"({
  "group_hyperparams": [{"beta1": 0.9, "beta2": 0.99, "eps": 1e-08, "lr": 0.003, "lr_decay": 0.0,
                         "weight_decay": 0.1}],
  "loss_scaler": {"any_overflow": false, "hysteresis_left": 2, "iteration": 4, "last_overflow_iteration": 0,
                  "scale": 65536.0},
  "next_step": 4,
  "optimizer_steps": 4,
  "owner_uid": 1000,
  "settings": {"deepspeedConfigJson": "{\"zero_optimization\": {\"stage\": 3}}", "externalStepAgreement": true,
               "gradDtype": "fp16", "localRanks": [1], "mode": "MODE_INFINITY", "name": "gpt",
               "optimizer": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-08, "lr": 0.001, "type": "adamw",
                             "weightDecay": 0.01},
               "paramDtype": "fp16", "pinnedBudgetBytes": "1048576", "worldSize": 2},
  "tensors": [{"group": 0, "name": "w", "numel": 300}]
})";

TEST(JobRecordTest, ReadsTheSettingsEarlierDaemonsWroteIntoItsOwnTypes) {
  auto r = ParseJobRecord(kEarlierRecord, "rec");
  ASSERT_TRUE(r.ok()) << r.status();
  const JobRequest& s = r->settings;
  EXPECT_EQ(s.name, "gpt");
  EXPECT_EQ(s.world_size, 2u);
  EXPECT_EQ(s.mode, JobMode::kInfinity);
  ASSERT_TRUE(s.optimizer.has_value());
  EXPECT_EQ(s.optimizer->type, "adamw");
  EXPECT_EQ(s.optimizer->lr, 0.001);
  EXPECT_EQ(s.optimizer->weight_decay, 0.01);
  EXPECT_EQ(s.param_dtype, "fp16");
  EXPECT_EQ(s.pinned_budget_bytes, 1048576u);
  EXPECT_EQ(s.local_ranks, std::vector<uint32_t>{1});
  EXPECT_TRUE(s.external_step_agreement);
  ASSERT_EQ(r->group_hyperparams.size(), 1u);
  EXPECT_EQ(r->group_hyperparams[0], (GroupHyperparams{0.003, 0.9, 0.99, 1e-8, 0.1, 0}));
  EXPECT_EQ(r->owner_uid, 1000u);

  // Written back in the same form, and read back equal.
  const std::string text = SerializeJobRecord(*r);
  for (const char* kept : {R"("pinnedBudgetBytes": "1048576")", R"("mode": "MODE_INFINITY")", R"("worldSize": 2)",
                           R"("localRanks": [)", R"("externalStepAgreement": true)", R"("weightDecay": 0.01)"}) {
    EXPECT_NE(text.find(kept), std::string::npos) << kept << " not in " << text;
  }
  auto again = ParseJobRecord(text, "rec");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->settings, r->settings);
  EXPECT_EQ(again->group_hyperparams, r->group_hyperparams);
  EXPECT_EQ(SerializeJobRecord(*again), text);
}

// No optimizer and a mode this daemon does not know stay that way (the
// settings are resolved, and refused, when the job is restored).
TEST(JobRecordTest, KeepsAnAbsentOptimizerAndAnUnknownMode) {
  std::string text = Record("1");
  auto r = ParseJobRecord(text, "rec");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->settings.optimizer.has_value());
  EXPECT_EQ(r->settings.mode, JobMode::kOffload);
  text.replace(text.find("\"MODE_OFFLOAD\""), 14, "7");
  auto unknown = ParseJobRecord(text, "rec");
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_FALSE(unknown->settings.mode.has_value());
  EXPECT_FALSE(ResolveJobSettings(unknown->settings).ok());
}

// The settings' JSON is written and read by job_request_json.cc, no longer
// by protobuf's JSON printer and parser: it writes what they wrote (they are
// the oracle here), and each reads what the other writes.
TEST(JobRequestJsonTest, WritesWhatProtobufWroteAndEachReadsTheOther) {
  std::vector<JobRequest> requests(4);
  JobRequest& full = requests[1];
  full.name = "gpt-2.x";
  full.world_size = 4096;
  full.mode = JobMode::kInfinity;
  full.deepspeed_config_json = R"({"zero_optimization": {"stage": 3}})";
  full.optimizer = JobRequest::Optimizer{"adamw", 0.001, 0.9, 0.999, 1e-8, 0.01, true, 0.5, 0.25};
  full.param_dtype = "bf16";
  full.grad_dtype = "fp32";
  full.pinned_budget_bytes = UINT64_MAX;
  full.device_budget_bytes = 1;
  full.local_ranks = {0, 7, 4095};
  full.external_step_agreement = true;
  requests[2].optimizer.emplace();  // present and empty: {}
  requests[2].mode = JobMode::kOffload;
  requests[3].optimizer = JobRequest::Optimizer{"lion", 0, 0.95, 0, 0, 0, false, 0, 0};
  for (const JobRequest& r : requests) {
    std::string printed;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(JobRequestToProto(r), &printed).ok());
    const nlohmann::json ours = JobRequestToJson(r);
    EXPECT_EQ(ours, nlohmann::json::parse(printed)) << ours.dump() << " vs " << printed;
    auto back = JobRequestFromJson(ours);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, r) << ours.dump();
    auto from_printed = JobRequestFromJson(nlohmann::json::parse(printed));
    ASSERT_TRUE(from_printed.ok()) << from_printed.status();
    EXPECT_EQ(*from_printed, r) << printed;
    strata::v1::CreateJobRequest parsed;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ours.dump(), &parsed).ok()) << ours.dump();
    EXPECT_EQ(JobRequestFromProto(parsed), r) << ours.dump();
  }
  // What protobuf's parser also took: snake_case keys, numbers for 64-bit
  // fields and the mode, strings for 32-bit ones, null for a default.
  auto loose = JobRequestFromJson(nlohmann::json::parse(
      R"({"world_size": "3", "mode": 2, "pinned_budget_bytes": 5, "optimizer": null, "local_ranks": [1]})"));
  ASSERT_TRUE(loose.ok()) << loose.status();
  EXPECT_EQ(loose->world_size, 3u);
  EXPECT_EQ(loose->mode, JobMode::kInfinity);
  EXPECT_EQ(loose->pinned_budget_bytes, 5u);
  EXPECT_FALSE(loose->optimizer.has_value());
  // And what it refused, refused here naming the field.
  for (const auto& [text, named] : std::vector<std::pair<std::string, std::string>>{
           {R"({"worldSize": -1})", "world_size"},
           {R"({"worldSize": 4294967296})", "world_size"},
           {R"({"name": 5})", "name"},
           {R"({"mode": "MODE_SIDEWAYS"})", "mode"},
           {R"({"optimizer": {"lr": "fast"}})", "optimizer.lr"},
           {R"({"optimizer": {"momentum": 0.9}})", "momentum"},
           {R"({"localRanks": [1.5]})", "local_ranks"},
           {R"({"colour": "blue"})", "colour"},
           {R"([1])", "not a JSON object"}}) {
    auto bad = JobRequestFromJson(nlohmann::json::parse(text));
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_NE(bad.status().message().find(named), std::string::npos) << text << ": " << bad.status();
  }
}

}  // namespace
}  // namespace strata
