#include "examples/shm_world.h"

#include <unistd.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "examples/rank_launcher.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

// Collectives run in forked ranks; a rank reports a mismatch by failing,
// which RunRanks turns into an error naming it.
TEST(ShmWorldTest, AllReduceAveragesInRankOrderOnEveryRank) {
  auto world = ShmWorld::Create(3, 1000);
  ASSERT_TRUE(world.ok()) << world.status();
  absl::Status status = RunRanks(3, [&](uint32_t rank) -> absl::Status {
    std::vector<float> data(1000);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(rank * 1000 + i) * 0.1f;
    (*world)->AllReduceAverage(rank, absl::MakeSpan(data));
    for (size_t i = 0; i < data.size(); ++i) {
      const float expected = ((static_cast<float>(i) * 0.1f + static_cast<float>(1000 + i) * 0.1f) +
                              static_cast<float>(2000 + i) * 0.1f) / 3.0f;
      if (data[i] != expected) {
        return absl::InternalError(absl::StrCat("element ", i, " is ", data[i], ", want ", expected));
      }
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

TEST(ShmWorldTest, AllGatherAssemblesEveryRanksRuns) {
  auto world = ShmWorld::Create(2, 100);
  ASSERT_TRUE(world.ok()) << world.status();
  absl::Status status = RunRanks(2, [&](uint32_t rank) -> absl::Status {
    std::vector<float> flat(100, -1.0f);
    // Rank 0 owns [0, 30) and [60, 100); rank 1 owns [30, 60).
    std::vector<FlatRun> owned = rank == 0 ? std::vector<FlatRun>{{0, 30}, {60, 40}}
                                           : std::vector<FlatRun>{{30, 30}};
    for (const FlatRun& run : owned) {
      for (uint64_t i = run.offset; i < run.offset + run.numel; ++i) flat[i] = static_cast<float>(i);
    }
    const FlatRun wanted{0, 100};
    (*world)->AllGather(rank, owned, absl::MakeConstSpan(&wanted, 1), absl::MakeSpan(flat));
    for (size_t i = 0; i < flat.size(); ++i) {
      if (flat[i] != static_cast<float>(i)) {
        return absl::InternalError(absl::StrCat("element ", i, " is ", flat[i]));
      }
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
}

// Rank 1 fails while rank 0 waits for it in a barrier: the launcher must
// stop rank 0 and name both.
TEST(RankLauncherTest, AFailedRankStopsTheOthersAndIsNamed) {
  auto world = ShmWorld::Create(2, 1);
  ASSERT_TRUE(world.ok()) << world.status();
  absl::Status status = RunRanks(2, [&](uint32_t rank) -> absl::Status {
    if (rank == 1) return absl::InternalError("injected failure");
    (*world)->Barrier();
    return absl::OkStatus();
  });
  ASSERT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  {
    const std::string message(status.message());
    EXPECT_NE(message.find("rank 1 exited with status 1 (the first to fail)"), std::string::npos)
        << message;
    EXPECT_NE(message.find("rank 0 was killed by signal"), std::string::npos) << message;
  }
}

TEST(RankLauncherTest, AllRanksSucceeding) {
  EXPECT_TRUE(RunRanks(4, [](uint32_t) { return absl::OkStatus(); }).ok());
}

}  // namespace
}  // namespace strata
