// CreateJob's reading of a DeepSpeed config: every optimizer DeepSpeed
// accepts parses (strata plan plans it), and stratad refuses, naming it and
// listing what it runs, the ones it has no CPU kernel for.
#include "daemon/job_settings.h"

#include <string>

#include "absl/strings/str_cat.h"
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

TEST(JobSettingsTest, RefusesOptimizerParamsItCannotUse) {
  strata::v1::CreateJobRequest r = Request("AdamW");
  r.set_deepspeed_config_json(
      R"({"zero_optimization": {"stage": 2}, "optimizer": {"type": "AdamW", "params": {"lr": "fast"}}})");
  auto s = ResolveJobSettings(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("optimizer.params.lr"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace strata
