#include "swap/manifest_journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "swap/testing/test_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

ExtentRecord Rec(uint32_t tensor, uint64_t gen) {
  ExtentRecord r;
  r.key.job = JobId(1);
  r.key.tensor = TensorId(tensor);
  r.key.kind = TensorKind::kExpAvg;
  r.offset_bytes = tensor * 65536;
  r.size_bytes = 1000 + tensor;
  r.extent_bytes = 65536;
  r.checksum = 0xABC0 + gen;
  r.generation = gen;
  return r;
}

std::string ReadFile(const std::string& path) {
  std::string out;
  int fd = open(path.c_str(), O_RDONLY);
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

void WriteFile(const std::string& path, const std::string& data) {
  int fd = open(path.c_str(), O_WRONLY | O_TRUNC | O_CREAT, 0600);
  ASSERT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  close(fd);
}

class ManifestJournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TestDir>(*TestDir::Create("manifest"));
    path_ = dir_->File("m");
  }
  std::unique_ptr<TestDir> dir_;
  std::string path_;
  std::vector<std::string> paths_ = {"/nvme0", "/nvme1"};
};

TEST_F(ManifestJournalTest, ReplaysCommittedChanges) {
  {
    ManifestState st;
    std::vector<std::string> w;
    auto j = ManifestJournal::Open(path_, paths_, &st, &w);
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_TRUE(st.extents.empty());
    ASSERT_TRUE((*j)->AppendCommit({{false, Rec(1, 1)}, {false, Rec(2, 2)}}, 1, 2, true).ok());
    ManifestChange del{true, Rec(1, 3)};
    ASSERT_TRUE((*j)->AppendCommit({del, {false, Rec(3, 4)}}, 2, 4, true).ok());
  }
  ManifestState st;
  std::vector<std::string> w;
  auto j = ManifestJournal::Open(path_, paths_, &st, &w);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_TRUE(w.empty());
  ASSERT_EQ(st.extents.size(), 2u);
  EXPECT_EQ(st.extents.at(Rec(2, 2).key), Rec(2, 2));
  EXPECT_EQ(st.extents.at(Rec(3, 4).key), Rec(3, 4));
  EXPECT_EQ(st.commit_seq, 2u);
  EXPECT_EQ(st.max_generation, 4u);
}

TEST_F(ManifestJournalTest, EveryTruncationOfTheLastCommitRollsItBackEntirely) {
  uint64_t before = 0;
  {
    ManifestState st;
    std::vector<std::string> w;
    auto j = ManifestJournal::Open(path_, paths_, &st, &w);
    ASSERT_TRUE(j.ok());
    ASSERT_TRUE((*j)->AppendCommit({{false, Rec(1, 1)}}, 1, 1, true).ok());
    before = (*j)->size_bytes();
    ASSERT_TRUE((*j)->AppendCommit({{false, Rec(1, 2)}, {false, Rec(2, 3)}}, 2, 3, true).ok());
  }
  const std::string full = ReadFile(path_);
  for (size_t len = before; len <= full.size(); ++len) {
    WriteFile(path_, full.substr(0, len));
    ManifestState st;
    std::vector<std::string> w;
    auto j = ManifestJournal::Open(path_, paths_, &st, &w);
    ASSERT_TRUE(j.ok()) << len << ": " << j.status();
    if (len == full.size()) {
      EXPECT_EQ(st.extents.size(), 2u);
      EXPECT_EQ(st.extents.at(Rec(1, 2).key).generation, 2u);
    } else {
      ASSERT_EQ(st.extents.size(), 1u) << len;
      EXPECT_EQ(st.extents.at(Rec(1, 1).key).generation, 1u);
      EXPECT_EQ(w.size(), len > before ? 1u : 0u);
      // The torn tail is gone, so a new commit appends cleanly.
      EXPECT_EQ((*j)->size_bytes(), before);
    }
  }
}

TEST_F(ManifestJournalTest, DamageBeforeIntactRecordsIsDataLoss) {
  {
    ManifestState st;
    std::vector<std::string> w;
    auto j = ManifestJournal::Open(path_, paths_, &st, &w);
    ASSERT_TRUE((*j)->AppendCommit({{false, Rec(1, 1)}}, 1, 1, true).ok());
    ASSERT_TRUE((*j)->AppendCommit({{false, Rec(2, 2)}}, 2, 2, true).ok());
  }
  std::string data = ReadFile(path_);
  data[data.size() / 2] ^= 0x40;
  WriteFile(path_, data);
  ManifestState st;
  std::vector<std::string> w;
  auto j = ManifestJournal::Open(path_, paths_, &st, &w);
  EXPECT_TRUE(absl::IsDataLoss(j.status())) << j.status();
  EXPECT_THAT(j.status().message(), HasSubstr("corrupt"));
}

TEST_F(ManifestJournalTest, OtherDataPathsAreRefused) {
  {
    ManifestState st;
    std::vector<std::string> w;
    ASSERT_TRUE(ManifestJournal::Open(path_, paths_, &st, &w).ok());
  }
  ManifestState st;
  std::vector<std::string> w;
  auto j = ManifestJournal::Open(path_, {"/nvme1", "/nvme0"}, &st, &w);
  EXPECT_TRUE(absl::IsFailedPrecondition(j.status()));
  EXPECT_THAT(j.status().message(), HasSubstr("same paths in the same order"));
}

TEST_F(ManifestJournalTest, RewriteKeepsStateAndShrinks) {
  ManifestState st;
  std::vector<std::string> w;
  auto j = ManifestJournal::Open(path_, paths_, &st, &w);
  for (uint64_t g = 1; g <= 50; ++g) ASSERT_TRUE((*j)->AppendCommit({{false, Rec(1, g)}}, g, g, false).ok());
  uint64_t big = (*j)->size_bytes();
  ManifestState live;
  live.extents[Rec(1, 50).key] = Rec(1, 50);
  live.commit_seq = 50;
  live.max_generation = 50;
  ASSERT_TRUE((*j)->Rewrite(live).ok());
  EXPECT_LT((*j)->size_bytes(), big / 10);
  ASSERT_TRUE((*j)->AppendCommit({{false, Rec(2, 51)}}, 51, 51, true).ok());
  j->reset();
  ManifestState back;
  auto k = ManifestJournal::Open(path_, paths_, &back, &w);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(back.extents.size(), 2u);
  EXPECT_EQ(back.extents.at(Rec(1, 50).key), Rec(1, 50));
  EXPECT_EQ(back.max_generation, 51u);
}

}  // namespace
}  // namespace strata
