// CreateJob's reading of a DeepSpeed config: every optimizer DeepSpeed
// accepts parses (strata plan plans it), and stratad refuses, naming it and
// listing what it runs, the ones it has no CPU kernel for.
#include "daemon/job_settings.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/job_proto.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

strata::v1::CreateJobRequest Request(const std::string& optimizer_type) {
  strata::v1::CreateJobRequest r;
  r.set_name("j");
  r.set_world_size(1);
  r.set_mode(strata::v1::MODE_OFFLOAD);
  r.set_deepspeed_config_json(absl::StrCat(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}, "optimizer": {"type": ")",
      optimizer_type, R"(", "params": {"lr": 0.01}}})"));
  return r;
}

TEST(JobSettingsTest, RunsTheOptimizersItHasKernelsFor) {
  for (const char* type : {"Adam", "AdamW", "adagrad", "Lion"}) {
    auto s = ResolveJobSettings(Request(type));
    ASSERT_TRUE(s.ok()) << type << ": " << s.status();
    EXPECT_DOUBLE_EQ(s->optimizer.lr, 0.01);
  }
}

TEST(JobSettingsTest, RefusesOtherOptimizersNamingThemAndWhatItRuns) {
  for (const char* type : {"Lamb", "OneBitAdam", "MuSGD", "SGD"}) {
    auto s = ResolveJobSettings(Request(type));
    ASSERT_FALSE(s.ok()) << type;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(absl::StrCat("'", type, "'")), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find("Adam, AdamW, Adagrad and Lion"), std::string::npos);
  }
}

// Issue 30.1: the refusal is of the optimizer the job would run, whichever
// source named it. A request naming LAMB used to get through, and the daemon
// then stepped it per tile, not per tensor (its trust ratio silently wrong).
strata::v1::CreateJobRequest RequestNaming(const std::string& request_type) {
  strata::v1::CreateJobRequest r = Request("AdamW");
  r.mutable_optimizer()->set_type(request_type);
  r.mutable_optimizer()->set_lr(0.01);
  return r;
}

TEST(JobSettingsTest, RefusesLambAndUnknownOptimizersNamedByTheRequest) {
  for (const char* type : {"lamb", "LAMB", "Lamb", "sgd"}) {
    auto s = ResolveJobSettings(RequestNaming(type));
    ASSERT_FALSE(s.ok()) << type << " was accepted";
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
    const std::string message(s.status().message());
    EXPECT_NE(message.find(absl::StrCat("optimizer.type '", type, "'")), std::string::npos) << message;
    EXPECT_NE(message.find("Adam, AdamW, Adagrad and Lion"), std::string::npos) << message;
    // Only the config's path is "deepspeed_config_json: ..."; this one is the request's field.
    EXPECT_EQ(message.find("deepspeed_config_json"), std::string::npos) << message;
  }
}

TEST(JobSettingsTest, RefusesLambFromTheConfigAndRunsWhatTheRequestNamesOverIt) {
  auto from_config = ResolveJobSettings(Request("Lamb"));
  ASSERT_FALSE(from_config.ok());
  EXPECT_NE(from_config.status().message().find("deepspeed_config_json: optimizer.type 'Lamb'"), std::string::npos)
      << from_config.status();
  // The request's optimizer overrides the config's, so a LAMB config with an
  // AdamW request runs AdamW: the check is of the kind that was resolved.
  strata::v1::CreateJobRequest r = RequestNaming("adamw");
  r.set_deepspeed_config_json(
      R"({"zero_optimization": {"stage": 2}, "optimizer": {"type": "Lamb", "params": {"lr": 0.01}}})");
  auto overridden = ResolveJobSettings(r);
  ASSERT_TRUE(overridden.ok()) << overridden.status();
  EXPECT_EQ(overridden->optimizer.kind, OptimizerKind::kAdamW);
}

TEST(JobSettingsTest, RunsTheOptimizersItHasKernelsForWhenTheRequestNamesThem) {
  for (const char* type : {"adam", "AdamW", "adagrad", "LION"}) {
    auto s = ResolveJobSettings(RequestNaming(type));
    ASSERT_TRUE(s.ok()) << type << ": " << s.status();
    EXPECT_DOUBLE_EQ(s->optimizer.lr, 0.01);
  }
}

// Issue 30.3: a pinned budget near 2^64 wrapped the window's reservation
// (budget + staging) to a few pages. No host has 2^50 bytes to pin, so a
// budget above that is refused as soon as the job is created.
TEST(JobSettingsTest, RefusesAPinnedBudgetAboveTheCeilingNamingTheFieldAndTheCeiling) {
  strata::v1::CreateJobRequest r = Request("AdamW");
  for (uint64_t huge : {~uint64_t{0}, ~uint64_t{0} - 100, (uint64_t{1} << 50) + 1}) {
    r.set_pinned_budget_bytes(huge);
    auto s = ResolveJobSettings(r);
    ASSERT_FALSE(s.ok()) << huge << " was accepted";
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(s.status().message());
    EXPECT_NE(message.find(absl::StrCat("pinned_budget_bytes ", huge)), std::string::npos) << message;
    EXPECT_NE(message.find("1.0 PiB"), std::string::npos) << message;
  }
  r.set_pinned_budget_bytes(uint64_t{1} << 50);
  auto at_ceiling = ResolveJobSettings(r);
  ASSERT_TRUE(at_ceiling.ok()) << at_ceiling.status();
  EXPECT_EQ(at_ceiling->pinned_budget_bytes, uint64_t{1} << 50);
}

TEST(JobSettingsTest, RefusesOptimizerParamsItCannotUse) {
  strata::v1::CreateJobRequest r = Request("AdamW");
  r.set_deepspeed_config_json(
      R"({"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": "fast"}}})");
  auto s = ResolveJobSettings(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("optimizer.params.lr"), std::string::npos) << s.status();
}

// Issue 11.1: what crashed CreateJob (a recursive dump of a 200k-deep
// value on the error path) or came back UNKNOWN (1e400) is InvalidArgument.
TEST(JobSettingsTest, HostileConfigsAreInvalidArgumentNamingTheProblem) {
  strata::v1::CreateJobRequest r = Request("AdamW");
  r.set_deepspeed_config_json(absl::StrCat(R"({"zero_optimization": )", std::string(200000, '['),
                                           std::string(200000, ']'), "}"));
  auto deep = ResolveJobSettings(r);
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(deep.status().message().find("deeper than"), std::string::npos) << deep.status();
  r.set_deepspeed_config_json(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1e400}})");
  auto big = ResolveJobSettings(r);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("zero_optimization.reduce_bucket_size"), std::string::npos)
      << big.status();
}

// The service edge: what CreateJob sends is what the daemon resolves, and
// converts back to the same message (job records keep it in that form).
TEST(JobProtoTest, RequestsAndModesConvertBothWays) {
  EXPECT_EQ(JobModeFromProto(strata::v1::MODE_OFFLOAD), JobMode::kOffload);
  EXPECT_EQ(JobModeFromProto(strata::v1::MODE_INFINITY), JobMode::kInfinity);
  EXPECT_EQ(JobModeFromProto(strata::v1::MODE_UNSPECIFIED), std::nullopt);
  EXPECT_EQ(JobModeFromProto(static_cast<strata::v1::Mode>(9)), std::nullopt);
  EXPECT_EQ(JobModeToProto(JobMode::kInfinity), strata::v1::MODE_INFINITY);

  strata::v1::CreateJobRequest r = Request("AdamW");
  r.mutable_optimizer()->set_type("lion");
  r.mutable_optimizer()->set_lr(0.5);
  r.set_pinned_budget_bytes(uint64_t{1} << 40);
  r.add_local_ranks(0);
  r.set_external_step_agreement(true);
  const JobRequest domain = JobRequestFromProto(r);
  EXPECT_EQ(domain.mode, JobMode::kOffload);
  ASSERT_TRUE(domain.optimizer.has_value());
  EXPECT_EQ(domain.optimizer->type, "lion");
  EXPECT_EQ(JobRequestToProto(domain).SerializeAsString(), r.SerializeAsString());
  EXPECT_FALSE(JobRequestFromProto(Request("Adam")).optimizer.has_value());

  // Settings resolved from a request resolve again, the same, from their request form.
  auto s = ResolveJobSettings(r);
  ASSERT_TRUE(s.ok()) << s.status();
  auto again = ResolveJobSettings(JobSettingsToRequest(*s));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(JobSettingsToRequest(*again), JobSettingsToRequest(*s));
  EXPECT_EQ(again->optimizer.kind, OptimizerKind::kLion);
  EXPECT_EQ(again->pinned_budget_bytes, uint64_t{1} << 40);

  strata::v1::GroupHyperparams g;
  g.set_lr(0.1);
  g.set_lr_decay(0.2);
  EXPECT_EQ(GroupHyperparamsFromProto(g), (GroupHyperparams{0.1, 0, 0, 0, 0, 0.2}));
}

}  // namespace
}  // namespace strata
