// ParseJobRecord refuses what the fuzzer found (daemon/fuzz/job_record_fuzz):
// numbers that are not whole or out of range (a float cast to an integer is
// undefined behaviour) and nesting deep enough to overflow the stack.
#include "daemon/job_record.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

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

}  // namespace
}  // namespace strata
