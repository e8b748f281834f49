#include "swap/io_engine.h"

#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

TEST(IoEngineOptionsTest, DefaultsAreValid) {
  EXPECT_TRUE(ValidateIoEngineOptions(IoEngineOptions{}).ok());
}

TEST(IoEngineOptionsTest, QueueDepthOutOfRangeNamesTheRange) {
  IoEngineOptions o;
  o.queue_depth = 0;
  absl::Status s = ValidateIoEngineOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("1..4096"));
  o.queue_depth = 5000;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateIoEngineOptions(o)));
}

TEST(IoEngineOptionsTest, BlockSizeMustBeMultipleOf4096) {
  IoEngineOptions o;
  o.block_size_bytes = 1000;
  absl::Status s = ValidateIoEngineOptions(o);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("multiple of 4096"));
  o.block_size_bytes = (uint64_t{1} << 30) + 4096;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateIoEngineOptions(o)));
}

TEST(IoEngineKindTest, ParsesNamesAndAliases) {
  EXPECT_EQ(*ParseIoEngineKind("io_uring"), IoEngineKind::kUring);
  EXPECT_EQ(*ParseIoEngineKind("URING"), IoEngineKind::kUring);
  EXPECT_EQ(*ParseIoEngineKind("libaio"), IoEngineKind::kAio);
  EXPECT_EQ(*ParseIoEngineKind("aio"), IoEngineKind::kAio);
  EXPECT_EQ(*ParseIoEngineKind("psync"), IoEngineKind::kPsync);
  absl::StatusOr<IoEngineKind> bad = ParseIoEngineKind("spdk");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(bad.status().message(), HasSubstr("io_uring, libaio or psync"));
  for (IoEngineKind k : {IoEngineKind::kUring, IoEngineKind::kAio, IoEngineKind::kPsync}) {
    EXPECT_EQ(*ParseIoEngineKind(IoEngineKindName(k)), k);
  }
}

TEST(OpenIoEngineTest, ForcedChoiceIsHonoured) {
  std::vector<std::string> notes;
  absl::StatusOr<std::unique_ptr<IoEngine>> e =
      OpenIoEngine(IoEngineOptions{}, IoEngineKind::kPsync, &notes);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ((*e)->info().name, "psync");
  EXPECT_TRUE(notes.empty());
}

TEST(OpenIoEngineTest, AutoPicksTheFirstThatWorksAndExplainsSkips) {
  std::vector<std::string> notes;
  absl::StatusOr<std::unique_ptr<IoEngine>> e = OpenIoEngine(IoEngineOptions{}, std::nullopt, &notes);
  ASSERT_TRUE(e.ok()) << e.status();
  // Whatever was chosen, every engine before it left a reason.
  const std::string& name = (*e)->info().name;
  size_t expected_notes = name == "io_uring" ? 0 : name == "libaio" ? 1 : 2;
  EXPECT_EQ(notes.size(), expected_notes);
  if (name != "io_uring") {
    EXPECT_THAT(notes[0], HasSubstr("io_uring unavailable"));
  }
}

TEST(OpenIoEngineTest, BadOptionsFailInsteadOfFallingBack) {
  IoEngineOptions o;
  o.queue_depth = 0;
  std::vector<std::string> notes;
  EXPECT_TRUE(absl::IsInvalidArgument(OpenIoEngine(o, std::nullopt, &notes).status()));
}

}  // namespace
}  // namespace strata
