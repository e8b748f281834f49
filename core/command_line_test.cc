#include "core/command_line.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

absl::Status ParseArgs(CommandLine& flags, std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return flags.Parse(static_cast<int>(argv.size()), argv.data());
}

TEST(CommandLineTest, ParsesBothValueFormsBoolsAndPositionals) {
  std::string dir;
  bool json = false, direct = true;
  int seen_size = 0;
  CommandLine flags("strata bench io");
  flags.AddString("dir", &dir, "directory");
  flags.AddBool("json", &json, "json");
  flags.AddBool("direct", &direct, "O_DIRECT");
  flags.AddParsed("size", [&](absl::string_view v) {
    seen_size = static_cast<int>(v.size());
    return absl::OkStatus();
  }, "size");
  ASSERT_TRUE(ParseArgs(flags, {"io", "--dir", "/x", "--json", "--nodirect", "--size=16GiB", "extra"}).ok());
  EXPECT_EQ(dir, "/x");
  EXPECT_TRUE(json);
  EXPECT_FALSE(direct);
  EXPECT_EQ(seen_size, 5);
  ASSERT_EQ(flags.positional().size(), 1u);
}

TEST(CommandLineTest, ErrorsNameTheFlag) {
  std::string dir;
  CommandLine flags("strata plan");
  flags.AddString("dir", &dir, "directory");
  flags.AddParsed("gpu-mem", [](absl::string_view) {
    return absl::InvalidArgumentError("--gpu-mem: bad");
  }, "size");
  absl::Status unknown = ParseArgs(flags, {"plan", "--bogus=1"});
  EXPECT_NE(unknown.message().find("unknown flag --bogus"), std::string::npos);
  absl::Status missing = ParseArgs(flags, {"plan", "--dir"});
  EXPECT_NE(missing.message().find("--dir needs a value"), std::string::npos);
  absl::Status bad = ParseArgs(flags, {"plan", "--gpu-mem", "12XB"});
  EXPECT_NE(bad.message().find("--gpu-mem"), std::string::npos);
}

}  // namespace
}  // namespace strata
