#include "bench/peer_process.h"

#include <string>
#include <vector>

#include "bench/plot_runner.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(PeerProcessTest, CollectsJsonLinesExitCodeAndStderr) {
  absl::StatusOr<PeerOutput> out = RunPeerProcess(PeerCommand{
      {"/bin/sh", "-c", "echo '{\"a\": 1}'; echo not json; echo \"{\\\"v\\\": \\\"$PEER_X\\\"}\"; "
                        "echo oops >&2; exit 3"},
      {"PEER_X=seen"}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->exit_code, 3);
  ASSERT_EQ(out->lines.size(), 2u);
  EXPECT_EQ(out->lines[0]["a"], 1);
  EXPECT_EQ(out->lines[1]["v"], "seen");  // the extra environment reached it
  EXPECT_EQ(out->stderr_tail, "oops\n");
  EXPECT_NE(PeerFailure(*out).find("oops"), std::string::npos);
}

TEST(PeerProcessTest, PeerErrorLineIsTheFailure) {
  absl::StatusOr<PeerOutput> out =
      RunPeerProcess(PeerCommand{{"/bin/sh", "-c", "echo '{\"error\": \"no torch\"}'; exit 3"}, {}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(PeerFailure(*out), "no torch");
}

TEST(PeerProcessTest, MissingProgramIsAnError) {
  EXPECT_FALSE(RunPeerProcess(PeerCommand{{"/nonexistent/strata-peer"}, {}}).ok());
  EXPECT_FALSE(RunPeerProcess(PeerCommand{}).ok());
}

TEST(PeerCoprocessTest, AnswersRequestsThenReportsItsExit) {
  absl::StatusOr<std::unique_ptr<PeerCoprocess>> p = PeerCoprocess::Start(PeerCommand{
      {"/bin/sh", "-c",
       "echo '{\"ready\": true}'; while read l; do [ \"$l\" = quit ] && { echo bye >&2; exit 0; }; "
       "echo noise; echo \"{\\\"got\\\": \\\"$l\\\"}\"; done"},
      {}});
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<nlohmann::json> ready = (*p)->Next();
  ASSERT_TRUE(ready.ok());
  EXPECT_TRUE((*ready)["ready"].get<bool>());
  for (const char* req : {"read 1048576 8 0.1", "write 4096 1 0.1"}) {
    absl::StatusOr<nlohmann::json> r = (*p)->Request(req);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*r)["got"], req);
  }
  absl::StatusOr<nlohmann::json> gone = (*p)->Request("quit");
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.status().message().find("bye"), std::string::npos);
}

TEST(FindVenvPythonTest, FlagMustBeExecutable) {
  std::string how;
  EXPECT_EQ(FindVenvPython("/nonexistent/python", false, &how).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::string> sh = FindVenvPython("/bin/sh", false, &how);
  ASSERT_TRUE(sh.ok());
  EXPECT_EQ(*sh, "/bin/sh");
  EXPECT_EQ(how, "--python");
}

TEST(PlotFlagTest, AddsJsonWhenMissingAndKeepsTheUsersOtherwise) {
  std::vector<std::string> args = {"adam", "--size", "1M"};
  absl::StatusOr<std::optional<PlotRequest>> none = TakePlotFlag(&args);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  EXPECT_EQ(args.size(), 3u);

  args = {"adam", "--plot", "a.png", "--size", "1M"};
  absl::StatusOr<std::optional<PlotRequest>> r = TakePlotFlag(&args);
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->png, "a.png");
  EXPECT_TRUE((*r)->temporary_json);
  ASSERT_EQ(args.size(), 5u);
  EXPECT_EQ(args[3], "--json");
  EXPECT_EQ(args[4], (*r)->json);

  args = {"io", "--json", "mine.json", "--plot=b.png"};
  r = TakePlotFlag(&args);
  ASSERT_TRUE(r.ok() && r->has_value());
  EXPECT_EQ((*r)->json, "mine.json");
  EXPECT_FALSE((*r)->temporary_json);
  EXPECT_EQ(args, (std::vector<std::string>{"io", "--json", "mine.json"}));

  args = {"rpc", "--plot"};
  EXPECT_FALSE(TakePlotFlag(&args).ok());
  args = {"rpc", "--plot="};
  EXPECT_FALSE(TakePlotFlag(&args).ok());
}

}  // namespace
}  // namespace strata
