#include "core/byte_size.h"

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(ParseByteSizeTest, AcceptsBinaryAndDecimalUnits) {
  EXPECT_EQ(*ParseByteSize("16GiB"), 16ull << 30);
  EXPECT_EQ(*ParseByteSize("16GB"), 16'000'000'000ull);
  EXPECT_EQ(*ParseByteSize("512MiB"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("1.5e9"), 1'500'000'000ull);
  EXPECT_EQ(*ParseByteSize("4096"), 4096ull);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseByteSize("1TB"), 1'000'000'000'000ull);
  EXPECT_EQ(*ParseByteSize("2tib"), 2ull << 40);
  EXPECT_EQ(*ParseByteSize("64k"), 64'000ull);
  EXPECT_EQ(*ParseByteSize(" 8 MiB "), 8ull << 20);
  EXPECT_EQ(*ParseByteSize("100B"), 100ull);
}

TEST(ParseByteSizeTest, RejectsGarbageWithTheAcceptedForms) {
  for (const char* bad : {"12XB", "-5", "", "GiB", "1.5.5G", "nan", "inf", "0x10", "1e99",
                          "3 bananas", "0.5"}) {
    auto result = ParseByteSize(bad);
    ASSERT_FALSE(result.ok()) << bad;
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(result.status().message().find("expected"), std::string::npos) << bad;
  }
  EXPECT_NE(ParseByteSize("12XB").status().message().find("unknown unit 'XB'"),
            std::string::npos);
}

TEST(ParseCountTest, AcceptsParameterCounts) {
  EXPECT_EQ(*ParseCount("1.3B"), 1'300'000'000ull);
  EXPECT_EQ(*ParseCount("7e9"), 7'000'000'000ull);
  EXPECT_EQ(*ParseCount("1T"), 1'000'000'000'000ull);
  EXPECT_EQ(*ParseCount("350M"), 350'000'000ull);
  EXPECT_EQ(*ParseCount("125k"), 125'000ull);
  EXPECT_EQ(*ParseCount("1000"), 1000ull);
}

TEST(ParseCountTest, RejectsNegativeAndUnknownSuffixes) {
  EXPECT_FALSE(ParseCount("-5").ok());
  EXPECT_FALSE(ParseCount("5X").ok());
  EXPECT_FALSE(ParseCount("1.3").ok());
  EXPECT_NE(ParseCount("-5").status().message().find("negative"), std::string::npos);
}

TEST(FormatTest, PrintsReadableUnits) {
  EXPECT_EQ(FormatBytes(16ull << 30), "16.0 GiB");
  EXPECT_EQ(FormatBytes(100), "100 B");
  EXPECT_EQ(FormatCount(1'300'000'000ull), "1.30B");
}

}  // namespace
}  // namespace strata
