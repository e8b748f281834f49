// Unit tests of the edge checks: checked arithmetic, request caps, the
// pinned budget, checkpoint path components and the TCP token file rules.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/checked_math.h"
#include "core/random_id.h"
#include "daemon/caller.h"
#include "daemon/checkpoint_dir.h"
#include "daemon/checkpoint_quota.h"
#include "daemon/daemon_config.h"
#include "daemon/pinned_budget.h"
#include "daemon/request_limits.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(CheckedMathTest, RefusesWrapAround) {
  EXPECT_EQ(*CheckedMul(1ull << 31, 1ull << 31, "x"), 1ull << 62);
  EXPECT_FALSE(CheckedMul(1ull << 62, 16, "region bytes").ok());
  EXPECT_NE(CheckedMul(1ull << 62, 16, "region bytes").status().message().find("region bytes"), std::string::npos);
  EXPECT_FALSE(CheckedAdd(~0ull, 1, "x").ok());
  EXPECT_EQ(*CheckedRoundUp(4097, 4096, "x"), 8192u);
  EXPECT_FALSE(CheckedRoundUp(~0ull - 1, 4096, "x").ok());
  EXPECT_FALSE(CheckedRoundUp(1, 0, "x").ok());
}

TEST(RandomIdTest, IdsAreNonZeroAndDiffer) {
  auto a = RandomId64(), b = RandomId64();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, 0u);
  EXPECT_NE(*a, *b);
  auto t = RandomHexToken(16);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->size(), 32u);
}

TEST(RequestLimitsTest, TensorListCapsNameTheField) {
  RequestLimits l;
  EXPECT_TRUE(ValidateTensorList(l, {{TensorId(0), "w", 10}}).ok());
  EXPECT_FALSE(ValidateTensorList(l, {}).ok());
  auto huge = ValidateTensorList(l, {{TensorId(0), "w", 1ull << 62}});
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.message().find("max_tensor_elements"), std::string::npos);
  l.max_tensor_elements = ~0ull;
  l.max_job_elements = ~0ull;
  auto wrap = ValidateTensorList(l, {{TensorId(0), "a", ~0ull}, {TensorId(1), "b", 2}});
  EXPECT_EQ(wrap.code(), absl::StatusCode::kInvalidArgument);
  RequestLimits small;
  small.max_job_elements = 100;
  EXPECT_EQ(ValidateTensorList(small, {{TensorId(0), "a", 60}, {TensorId(1), "b", 60}}).code(),
            absl::StatusCode::kResourceExhausted);
  small.max_name_length = 3;
  EXPECT_EQ(ValidateTensorList(small, {{TensorId(0), "long", 1}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateTensorList(small, {{TensorId(0), "z", 0}}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PinnedBudgetTest, ReservationsAreSharedAndGivenBack) {
  PinnedBudget budget(100);
  auto a = budget.Reserve(60, "job 'a'");
  ASSERT_TRUE(a.ok());
  auto b = budget.Reserve(60, "job 'b'");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("job 'b' needs"), std::string::npos) << b.status();
  { PinnedBudget::Reservation gone = std::move(*a); }
  EXPECT_EQ(budget.used(), 0u);
  EXPECT_TRUE(budget.Reserve(100, "job 'c'").ok());
  EXPECT_EQ(budget.used(), 0u);  // the temporary was destroyed
}

TEST(CheckpointDirTest, ComponentsStayBeneathTheRoot) {
  EXPECT_EQ(CheckpointComponents("", "x").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*CheckpointComponents("/r", "a/b"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(*CheckpointComponents("/r/", "/r/a//b/"), (std::vector<std::string>{"a", "b"}));
  for (const char* bad : {"", "..", "a/../b", "./a", "/etc/passwd", "/rx/a", "/r", "/r/"}) {
    EXPECT_EQ(CheckpointComponents("/r", bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(CheckpointComponents("/r", std::string("a\0b", 3)).ok());
  EXPECT_FALSE(CheckpointComponents("/r", std::string(300, 'x')).ok());
}

TEST(CheckpointDirTest, ResolvingRefusesLinksAndMakesParents) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/ckdir-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/outside");
  const std::string root = dir + "/root";
  auto place = ResolveCheckpointPlace(CheckpointScope{root, {}, std::nullopt}, "a/b/c", /*create_parents=*/true);
  ASSERT_TRUE(place.ok()) << place.status();
  EXPECT_EQ(place->leaf, "c");
  EXPECT_EQ(place->path, root + "/a/b/c");
  EXPECT_TRUE(std::filesystem::is_directory(root + "/a/b"));
  EXPECT_EQ(OpenCheckpointDir(*place).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::create_directory_symlink(dir + "/outside", root + "/link");
  EXPECT_EQ(ResolveCheckpointPlace(CheckpointScope{root, {}, std::nullopt}, "link/x", true).status().code(), absl::StatusCode::kInvalidArgument);
  auto linked = ResolveCheckpointPlace(CheckpointScope{root, {}, std::nullopt}, "link", false);
  ASSERT_TRUE(linked.ok());
  EXPECT_EQ(OpenCheckpointDir(*linked).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveCheckpointPlace(CheckpointScope{root, {}, std::nullopt}, "missing/x", false).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

// Issue 30, items 5 and 6: any user could save into (squat, probe) another
// user's directories under the root, and a root daemon's files were closed to
// the user who saved them.
TEST(CheckpointDirTest, AUsersPathsResolveInsideAHomeOfItsOwn) {
  if (geteuid() != 0) GTEST_SKIP() << "giving directories to another uid needs root";
  const std::string dir = absl::StrCat(::testing::TempDir(), "/ckhome-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string root = dir + "/root";
  const uid_t user = 54321;
  const CheckpointScope scope = ScopeFor(root, user, /*admin=*/false, geteuid());
  EXPECT_EQ(scope.HomePath(), root + "/users/54321");
  auto place = ResolveCheckpointPlace(scope, "runs/one", /*create_parents=*/true);
  ASSERT_TRUE(place.ok()) << place.status();
  EXPECT_EQ(place->path, root + "/users/54321/runs/one");
  EXPECT_EQ(place->display, "runs/one");
  struct stat st {};
  ASSERT_EQ(stat(root.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0711u);  // others pass through, list nothing
  ASSERT_EQ(stat((root + "/users").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0711u);
  EXPECT_EQ(st.st_uid, geteuid());
  for (const std::string& mine : {root + "/users/54321", root + "/users/54321/runs"}) {
    ASSERT_EQ(stat(mine.c_str(), &st), 0) << mine;
    EXPECT_EQ(st.st_uid, user) << mine;
    EXPECT_EQ(st.st_mode & 0777, 0700u) << mine;
  }
  // Another user's checkpoints and the root's own are out of reach: by
  // absolute path and by "..".
  EXPECT_EQ(ResolveCheckpointPlace(scope, root + "/admins-ckpt", true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveCheckpointPlace(scope, root + "/users/54322/x", true).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveCheckpointPlace(scope, "../54322/x", true).status().code(), absl::StatusCode::kInvalidArgument);
  // Its absolute path inside its home is its own.
  EXPECT_TRUE(ResolveCheckpointPlace(scope, root + "/users/54321/runs/two", true).ok());
  // Another uid's "home" (planted by someone with access) is refused, not used.
  std::filesystem::create_directories(root + "/users/54323");
  ASSERT_EQ(chown((root + "/users/54323").c_str(), 54324, static_cast<gid_t>(-1)), 0);
  auto planted = ResolveCheckpointPlace(ScopeFor(root, 54323, false, geteuid()), "x", true);
  EXPECT_EQ(planted.status().code(), absl::StatusCode::kFailedPrecondition) << planted.status();
  // An admin's paths are the root's, as before.
  auto admin = ResolveCheckpointPlace(ScopeFor(root, 0, /*admin=*/true, geteuid()), "users/54321/runs/three", true);
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_EQ(admin->path, root + "/users/54321/runs/three");
  std::filesystem::remove_all(dir);
}

TEST(CheckpointQuotaTest, BytesBeneathCountsFilesAndIsBounded) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/ckquota-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/a/b");
  {
    std::ofstream(dir + "/a/one") << std::string(1 << 20, 'x');
    std::ofstream(dir + "/a/b/two") << std::string(1 << 20, 'y');
  }
  std::filesystem::create_symlink("/usr", dir + "/a/link");  // not followed
  UniqueFd fd(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  auto bytes = BytesBeneath(fd.get());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_GE(*bytes, uint64_t{2} << 20);
  EXPECT_LT(*bytes, uint64_t{3} << 20);
  EXPECT_EQ(*BytesBeneath(fd.get()), *bytes);  // the fd can be walked again
  EXPECT_EQ(BytesBeneath(fd.get(), /*max_depth=*/1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(BytesBeneath(fd.get(), 40, /*max_entries=*/3).status().code(), absl::StatusCode::kResourceExhausted);
  CheckpointQuota fixed(12345);
  EXPECT_EQ(*fixed.LimitOn(fd.get()), 12345u);
  CheckpointQuota share(0);
  EXPECT_GT(*share.LimitOn(fd.get()), 0u);
  EXPECT_EQ(share.LimitAt(dir), *share.LimitOn(fd.get()));
  std::filesystem::remove_all(dir);
}

TEST(TcpTokenTest, OnlyAPrivateRegularFileIsAccepted) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/token-", getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/token";
  {
    std::ofstream out(path);
    out << "abcdefghijklmnopqrstuvwxyz\n";
  }
  chmod(path.c_str(), 0600);
  auto token = LoadTcpToken(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->secret, "abcdefghijklmnopqrstuvwxyz");
  EXPECT_EQ(token->owner, geteuid());
  chmod(path.c_str(), 0640);
  EXPECT_TRUE(LoadTcpToken(path).ok());
  for (mode_t bad : {0604, 0620, 0602}) {
    chmod(path.c_str(), bad);
    EXPECT_EQ(LoadTcpToken(path).status().code(), absl::StatusCode::kFailedPrecondition) << bad;
  }
  chmod(path.c_str(), 0600);
  std::filesystem::create_symlink(path, dir + "/link");
  EXPECT_FALSE(LoadTcpToken(dir + "/link").ok());
  {
    std::ofstream out(path);
    out << "short";
  }
  EXPECT_EQ(LoadTcpToken(path).status().code(), absl::StatusCode::kFailedPrecondition);
  std::filesystem::remove_all(dir);
}

TEST(DaemonConfigHardeningTest, TcpNeedsATokenFileAndCapsHaveCeilings) {
  strata::v1::DaemonConfig c;
  c.set_tcp_address("127.0.0.1:7070");
  auto s = ResolveDaemonSettings(c, "");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("tcp_token_file"), std::string::npos);
  c.set_tcp_token_file("/etc/strata/token");
  EXPECT_TRUE(ResolveDaemonSettings(c, "").ok());
  strata::v1::DaemonConfig d;
  d.set_max_tensor_elements(1ull << 50);
  EXPECT_FALSE(ResolveDaemonSettings(d, "").ok());
  strata::v1::DaemonConfig e;
  e.add_nvme_paths("/nvme");
  auto with_nvme = ResolveDaemonSettings(e, "");
  ASSERT_TRUE(with_nvme.ok());
  EXPECT_EQ(with_nvme->checkpoint_root, "/nvme/checkpoints");
  EXPECT_EQ(with_nvme->limits.max_jobs_per_uid, 64u);
  EXPECT_TRUE(ResolveDaemonSettings(strata::v1::DaemonConfig(), "")->checkpoint_root.empty());
}

}  // namespace
}  // namespace strata
