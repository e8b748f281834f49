#include "swap/extent_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "swap/aligned_buffer.h"
#include "swap/io_engine.h"
#include "swap/testing/fault_injection_io_engine.h"
#include "swap/testing/test_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;

ShardKey Key(uint32_t tensor, TensorKind kind = TensorKind::kExpAvg, uint32_t index = 0) {
  ShardKey k;
  k.job = JobId(7);
  k.rank = Rank(0);
  k.tensor = TensorId(tensor);
  k.kind = kind;
  k.index = index;
  return k;
}

AlignedBuffer Random(size_t size, uint64_t seed) {
  AlignedBuffer b = *AlignedBuffer::Allocate(size == 0 ? 1 : size);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < size; ++i) b.data()[i] = static_cast<std::byte>(rng());
  return b;
}

class ExtentStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TestDir>(*TestDir::Create("extent_store"));
    IoEngineOptions eo;
    eo.queue_depth = 8;
    eo.block_size_bytes = 256 << 10;
    std::vector<std::string> notes;
    engine_ = *OpenIoEngine(eo, std::nullopt, &notes);
    options_.paths = {dir_->path()};
    options_.capacity_bytes_per_path = 64 * kMiB;
    options_.io_chunk_bytes = 256 << 10;
  }

  absl::StatusOr<std::unique_ptr<ExtentStore>> Open(IoEngine* engine = nullptr) {
    return ExtentStore::Open(options_, engine != nullptr ? engine : engine_.get());
  }

  // Reads `key` and compares with `want`; also checks that bytes past the
  // shard in the destination are untouched.
  void ExpectShard(ExtentStore& store, const ShardKey& key, const AlignedBuffer& want, size_t size) {
    AlignedBuffer got = *AlignedBuffer::Allocate(size + 8192);
    std::memset(got.data(), 0xAB, got.size());
    absl::StatusOr<uint64_t> n = store.Read(key, got.span());
    ASSERT_TRUE(n.ok()) << ShardKeyToString(key) << ": " << n.status();
    ASSERT_EQ(*n, size);
    ASSERT_EQ(std::memcmp(got.data(), want.data(), size), 0) << ShardKeyToString(key);
    for (size_t i = size; i < got.size(); ++i) ASSERT_EQ(got.data()[i], std::byte{0xAB});
  }

  std::string DataFile() const { return dir_->File("strata-extents.data"); }
  std::string ManifestFile() const { return dir_->File("strata-extents.manifest"); }

  std::unique_ptr<TestDir> dir_;
  std::unique_ptr<IoEngine> engine_;
  ExtentStoreOptions options_;
};

TEST_F(ExtentStoreTest, RandomShardsRoundTrip) {
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  std::mt19937 rng(301);
  std::map<uint32_t, std::pair<AlignedBuffer, size_t>> written;
  for (uint32_t t = 0; t < 40; ++t) {
    // Sizes include empty, one byte, unaligned tails and multi-chunk shards.
    size_t size = t == 0 ? 0 : t == 1 ? 1 : rng() % (3 * kMiB);
    AlignedBuffer b = Random(size, t);
    ASSERT_TRUE((*store)->Write(Key(t), absl::MakeConstSpan(b.data(), size)).ok());
    written.emplace(t, std::make_pair(std::move(b), size));
  }
  ASSERT_TRUE((*store)->Commit().ok());
  for (auto& [t, w] : written) ExpectShard(**store, Key(t), w.first, w.second);
  EXPECT_EQ((*store)->Keys().size(), 40u);
  EXPECT_EQ(*(*store)->SizeOf(Key(1)), 1u);

  // And after a reopen, from the manifest.
  store->reset();
  auto again = Open();
  ASSERT_TRUE(again.ok()) << again.status();
  for (auto& [t, w] : written) ExpectShard(**again, Key(t), w.first, w.second);
  EXPECT_EQ((*again)->Stats().shard_count, 40u);
}

TEST_F(ExtentStoreTest, FlippedByteOnDiskIsDataLossNotWrongData) {
  for (ChecksumKind kind : {ChecksumKind::kXxh3, ChecksumKind::kCrc32c}) {
    SCOPED_TRACE(ChecksumKindName(kind));
    options_.checksum = kind;
    auto store = Open();
    ASSERT_TRUE(store.ok()) << store.status();
    AlignedBuffer b = Random(kMiB + 123, 5);
    ASSERT_TRUE((*store)->Write(Key(1), absl::MakeConstSpan(b.data(), kMiB + 123)).ok());
    ASSERT_TRUE((*store)->Commit().ok());
    store->reset();
    // The first extent of an empty store starts at offset 0. Flip one byte in
    // the middle, behind the store's back (buffered write, then flushed so
    // the O_DIRECT read sees it).
    int fd = open(DataFile().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    unsigned char c;
    ASSERT_EQ(pread(fd, &c, 1, 700000), 1);
    c ^= 0x10;
    ASSERT_EQ(pwrite(fd, &c, 1, 700000), 1);
    ASSERT_EQ(fsync(fd), 0);
    close(fd);
    auto reopened = Open();
    ASSERT_TRUE(reopened.ok()) << reopened.status();
    AlignedBuffer into = *AlignedBuffer::Allocate(2 * kMiB);
    absl::StatusOr<uint64_t> n = (*reopened)->Read(Key(1), into.span());
    EXPECT_TRUE(absl::IsDataLoss(n.status())) << n.status();
    EXPECT_THAT(n.status().message(), HasSubstr(ShardKeyToString(Key(1))));
    EXPECT_THAT(n.status().message(), HasSubstr("checksum mismatch"));
    EXPECT_THAT(n.status().message(), HasSubstr(DataFile()));
    // Clean up for the next checksum kind.
    ASSERT_TRUE((*reopened)->Delete(Key(1)).ok());
    ASSERT_TRUE((*reopened)->Commit().ok());
  }
}

TEST_F(ExtentStoreTest, ReopenAfterCrashShowsLastCommittedVersions) {
  AlignedBuffer a1 = Random(300000, 1), b1 = Random(5000, 2), a2 = Random(700000, 3), c1 = Random(4096, 4);
  {
    auto store = Open();
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Write(Key(1), absl::MakeConstSpan(a1.data(), 300000)).ok());
    ASSERT_TRUE((*store)->Write(Key(2), absl::MakeConstSpan(b1.data(), 5000)).ok());
    ASSERT_TRUE((*store)->Commit().ok());
    // Uncommitted changes, then a "crash": the store goes away without Commit.
    ASSERT_TRUE((*store)->Write(Key(1), absl::MakeConstSpan(a2.data(), 700000)).ok());
    ASSERT_TRUE((*store)->Write(Key(3), absl::MakeConstSpan(c1.data(), 4096)).ok());
    ASSERT_TRUE((*store)->Delete(Key(2)).ok());
    ExpectShard(**store, Key(1), a2, 700000);  // readable before commit
    EXPECT_FALSE((*store)->Contains(Key(2)));
  }
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  ExpectShard(**store, Key(1), a1, 300000);
  ExpectShard(**store, Key(2), b1, 5000);
  EXPECT_TRUE(absl::IsNotFound((*store)->SizeOf(Key(3)).status()));
  EXPECT_EQ((*store)->Keys(), (std::vector<ShardKey>{Key(1), Key(2)}));
}

TEST_F(ExtentStoreTest, CrashAtAnyByteOfACommitGivesOldOrNewNeverTorn) {
  std::vector<AlignedBuffer> v1, v2;
  for (uint32_t t = 0; t < 4; ++t) v1.push_back(Random(100000 + t * 70000, 10 + t));
  for (uint32_t t = 0; t < 4; ++t) v2.push_back(Random(90000 + t * 50000, 20 + t));
  uint64_t before = 0;
  {
    auto store = Open();
    ASSERT_TRUE(store.ok());
    for (uint32_t t = 0; t < 4; ++t) {
      ASSERT_TRUE((*store)->Write(Key(t), absl::MakeConstSpan(v1[t].data(), 100000 + t * 70000)).ok());
    }
    ASSERT_TRUE((*store)->Commit().ok());
    int fd = open(ManifestFile().c_str(), O_RDONLY);
    before = lseek(fd, 0, SEEK_END);
    close(fd);
    for (uint32_t t = 0; t < 3; ++t) {
      ASSERT_TRUE((*store)->Write(Key(t), absl::MakeConstSpan(v2[t].data(), 90000 + t * 50000)).ok());
    }
    ASSERT_TRUE((*store)->Delete(Key(3)).ok());
    ASSERT_TRUE((*store)->Commit().ok());
  }
  std::string full;
  {
    int fd = open(ManifestFile().c_str(), O_RDONLY);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) full.append(buf, n);
    close(fd);
  }
  ASSERT_GT(full.size(), before);
  // A crash can cut the journal at any byte of the second commit.
  for (size_t len = before; len <= full.size(); len += (len + 7 < full.size() ? 7 : 1)) {
    SCOPED_TRACE(absl::StrCat("journal cut at ", len, " of ", full.size()));
    int fd = open(ManifestFile().c_str(), O_WRONLY | O_TRUNC);
    ASSERT_EQ(write(fd, full.data(), len), static_cast<ssize_t>(len));
    close(fd);
    auto store = Open();
    ASSERT_TRUE(store.ok()) << store.status();
    bool new_version = len == full.size();
    for (uint32_t t = 0; t < 3; ++t) {
      if (new_version) {
        ExpectShard(**store, Key(t), v2[t], 90000 + t * 50000);
      } else {
        ExpectShard(**store, Key(t), v1[t], 100000 + t * 70000);
      }
    }
    EXPECT_EQ((*store)->Contains(Key(3)), !new_version);
  }
}

TEST_F(ExtentStoreTest, TornDataWriteKeepsThePreviousVersion) {
  AlignedBuffer old_data = Random(2 * kMiB, 1), new_data = Random(2 * kMiB, 2);
  {
    auto store = Open();
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Write(Key(1), old_data.span()).ok());
    ASSERT_TRUE((*store)->Commit().ok());
  }
  FaultPolicy policy;
  policy.rules.push_back(FaultRule::OnNth(FaultKind::kTornWrite, 3, IoOp::kWrite));
  policy.rules.back().torn_bytes = 64 << 10;
  FaultInjectionIoEngine faulty(engine_.get(), policy);
  {
    auto store = Open(&faulty);
    ASSERT_TRUE(store.ok()) << store.status();
    absl::Status s = (*store)->Write(Key(1), new_data.span());
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("torn"));
    EXPECT_THAT(s.message(), HasSubstr("previous version is unchanged"));
    ExpectShard(**store, Key(1), old_data, 2 * kMiB);
    faulty.SimulateCrash();
  }
  auto store = Open();
  ASSERT_TRUE(store.ok());
  ExpectShard(**store, Key(1), old_data, 2 * kMiB);
}

TEST_F(ExtentStoreTest, EnospcLeavesEarlierDataIntact) {
  options_.capacity_bytes_per_path = 8 * kMiB;
  auto store = Open();
  ASSERT_TRUE(store.ok());
  std::vector<AlignedBuffer> shards;
  absl::Status s;
  uint32_t t = 0;
  for (; t < 100; ++t) {
    shards.push_back(Random(kMiB + 1000, t));
    s = (*store)->Write(Key(t), absl::MakeConstSpan(shards.back().data(), kMiB + 1000));
    if (!s.ok()) break;
  }
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("no free extent large enough"));
  EXPECT_THAT(s.message(), HasSubstr("free"));
  ASSERT_GT(t, 3u);
  ASSERT_TRUE((*store)->Commit().ok());
  for (uint32_t i = 0; i < t; ++i) ExpectShard(**store, Key(i), shards[i], kMiB + 1000);

  // An ENOSPC from the device itself (e.g. a thin-provisioned volume): the
  // write fails with the shard named and the old version survives.
  FaultPolicy policy;
  policy.rules.push_back(FaultRule::OnNth(FaultKind::kEnospc, 1, IoOp::kWrite));
  FaultInjectionIoEngine faulty(engine_.get(), policy);
  store->reset();
  auto again = Open(&faulty);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->Delete(Key(t - 1)).ok());
  ASSERT_TRUE((*again)->Commit().ok());
  AlignedBuffer replacement = Random(kMiB, 999);
  s = (*again)->Write(Key(0), replacement.span());
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(ShardKeyToString(Key(0))));
  EXPECT_THAT(s.message(), HasSubstr("ENOSPC"));
  ExpectShard(**again, Key(0), shards[0], kMiB + 1000);
  ASSERT_TRUE((*again)->Commit().ok());
  again->reset();
  auto third = Open();
  ASSERT_TRUE(third.ok());
  for (uint32_t i = 0; i + 1 < t; ++i) ExpectShard(**third, Key(i), shards[i], kMiB + 1000);
}

TEST_F(ExtentStoreTest, ReplacedExtentsAreReusedAfterCommit) {
  options_.capacity_bytes_per_path = 4 * kMiB;
  auto store = Open();
  ASSERT_TRUE(store.ok());
  AlignedBuffer b = Random(kMiB, 1);
  // Far more bytes than the capacity go through one key: old versions must be
  // recycled.
  for (int i = 0; i < 20; ++i) {
    b.data()[0] = static_cast<std::byte>(i);
    ASSERT_TRUE((*store)->Write(Key(1), b.span()).ok()) << i;
    ASSERT_TRUE((*store)->Commit().ok());
  }
  ExpectShard(**store, Key(1), b, kMiB);
  EXPECT_EQ((*store)->Stats().used_bytes, kMiB);
  EXPECT_EQ((*store)->Stats().free_bytes, 3 * kMiB);
  // Best fit recycles the same two slots, so free space stays in at most two runs.
  EXPECT_GE((*store)->Stats().largest_free_extent_bytes, 2 * kMiB);
}

TEST_F(ExtentStoreTest, RenameMovesAnUncommittedVersionOntoAnotherKey) {
  AlignedBuffer home1 = Random(300000, 1), home2 = Random(300000, 2), other = Random(5000, 3);
  const ShardKey home = Key(1, TensorKind::kParam16);
  const ShardKey scratch = Key(1, TensorKind::kParam16, /*index=*/1);
  {
    auto store = Open();
    ASSERT_TRUE(store.ok());
    ExtentStore& s = **store;
    ASSERT_TRUE(s.Write(home, absl::MakeConstSpan(home1.data(), 300000)).ok());
    ASSERT_TRUE(s.Commit().ok());
    const uint64_t used_before = s.Stats().used_bytes;
    ASSERT_TRUE(s.Write(scratch, absl::MakeConstSpan(home2.data(), 300000)).ok());
    const uint64_t generation = *s.GenerationOf(scratch);
    ASSERT_TRUE(s.Rename(scratch, home).ok());
    // The data did not move: the checksum (seeded by the generation) verifies
    // under the new key; the old home's extent waits for the commit.
    ExpectShard(s, home, home2, 300000);
    EXPECT_EQ(*s.GenerationOf(home), generation);
    EXPECT_FALSE(s.Contains(scratch));
    EXPECT_EQ(s.Keys(), std::vector<ShardKey>{home});
    EXPECT_EQ(s.Stats().used_bytes, 2 * used_before);
    ASSERT_TRUE(s.Commit().ok());
    EXPECT_EQ(s.Stats().used_bytes, used_before);
  }
  {
    // The manifest has the home's new version and no scratch shard.
    auto store = Open();
    ASSERT_TRUE(store.ok()) << store.status();
    ExtentStore& s = **store;
    EXPECT_EQ(s.Keys(), std::vector<ShardKey>{home});
    ExpectShard(s, home, home2, 300000);
    // A committed version is not renamed; bad keys are named.
    ASSERT_TRUE(s.Write(scratch, absl::MakeConstSpan(other.data(), 5000)).ok());
    ASSERT_TRUE(s.Commit().ok());
    absl::Status committed = s.Rename(scratch, home);
    EXPECT_TRUE(absl::IsFailedPrecondition(committed)) << committed;
    EXPECT_THAT(committed.message(), HasSubstr("committed"));
    EXPECT_TRUE(absl::IsNotFound(s.Rename(Key(9), home)));
    EXPECT_TRUE(absl::IsInvalidArgument(s.Rename(home, home)));
    ShardKey foreign = home;
    foreign.job = JobId(8);
    EXPECT_TRUE(absl::IsInvalidArgument(s.Rename(scratch, foreign)));
    ExpectShard(s, home, home2, 300000);
    ExpectShard(s, scratch, other, 5000);
  }
  // Durable across a reopen, with the committed scratch shard beside it.
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  ExpectShard(**store, home, home2, 300000);
  ExpectShard(**store, scratch, other, 5000);
}

TEST_F(ExtentStoreTest, RenameNotCommittedIsUndoneByRollbackAndByACrash) {
  AlignedBuffer v1 = Random(200000, 1), v2 = Random(200000, 2), s1 = Random(70000, 3);
  const ShardKey home = Key(1, TensorKind::kParam16);
  const ShardKey scratch = Key(1, TensorKind::kParam16, /*index=*/1);
  const ShardKey kept = Key(2, TensorKind::kParam16, /*index=*/1);
  {
    auto store = Open();
    ASSERT_TRUE(store.ok());
    ExtentStore& s = **store;
    ASSERT_TRUE(s.Write(home, absl::MakeConstSpan(v1.data(), 200000)).ok());
    // A committed version of the scratch key too: the rename deletes it.
    ASSERT_TRUE(s.Write(kept, absl::MakeConstSpan(s1.data(), 70000)).ok());
    ASSERT_TRUE(s.Commit().ok());
    const uint64_t used = s.Stats().used_bytes;
    ASSERT_TRUE(s.Write(scratch, absl::MakeConstSpan(v2.data(), 200000)).ok());
    ASSERT_TRUE(s.Rename(scratch, home).ok());
    ExpectShard(s, home, v2, 200000);
    s.Rollback(ExtentStore::OwnerOf(home));
    ExpectShard(s, home, v1, 200000);
    EXPECT_FALSE(s.Contains(scratch));
    EXPECT_EQ(s.Stats().used_bytes, used);  // the renamed extent is free again
    // Twice over a key with a committed version, then a crash before any
    // commit: nothing of it survives.
    ASSERT_TRUE(s.Write(kept, absl::MakeConstSpan(v2.data(), 200000)).ok());
    ASSERT_TRUE(s.Write(kept, absl::MakeConstSpan(v2.data(), 100000)).ok());
    ASSERT_TRUE(s.Rename(kept, home).ok());
    EXPECT_FALSE(s.Contains(kept));
    ExpectShard(s, home, v2, 100000);
  }
  {
    auto store = Open();
    ASSERT_TRUE(store.ok()) << store.status();
    ExpectShard(**store, home, v1, 200000);
    ExpectShard(**store, kept, s1, 70000);
    // Now committed: the old `kept` is deleted by the rename's commit.
    ASSERT_TRUE((*store)->Write(kept, absl::MakeConstSpan(v2.data(), 100000)).ok());
    ASSERT_TRUE((*store)->Rename(kept, home).ok());
    ASSERT_TRUE((*store)->Commit().ok());
  }
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  ExpectShard(**store, home, v2, 100000);
  EXPECT_FALSE((*store)->Contains(kept));
  EXPECT_EQ((*store)->Keys(), std::vector<ShardKey>{home});
}

TEST_F(ExtentStoreTest, BatchedSyncHoldsFreedExtentsUntilSync) {
  options_.sync_policy = SyncPolicy::kBatched;
  options_.sync_every_commits = 100;
  auto store = Open();
  ASSERT_TRUE(store.ok());
  AlignedBuffer b = Random(kMiB, 1);
  ASSERT_TRUE((*store)->Write(Key(1), b.span()).ok());
  ASSERT_TRUE((*store)->Commit().ok());
  ASSERT_TRUE((*store)->Write(Key(1), b.span()).ok());
  ASSERT_TRUE((*store)->Commit().ok());
  // The first version may still be what survives a power loss: not reused.
  EXPECT_EQ((*store)->Stats().used_bytes, 2 * kMiB);
  ASSERT_TRUE((*store)->Sync().ok());
  EXPECT_EQ((*store)->Stats().used_bytes, kMiB);
}

TEST_F(ExtentStoreTest, BadBuffersAndMissingShardsAreClearErrors) {
  auto store = Open();
  ASSERT_TRUE(store.ok());
  uint32_t align = (*store)->alignment();
  AlignedBuffer b = Random(64 << 10, 1);
  absl::Status s = (*store)->Write(Key(1), absl::MakeConstSpan(b.data() + 1, 1000));
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("not a multiple of ", align)));
  ASSERT_TRUE((*store)->Write(Key(1), b.span()).ok());
  absl::StatusOr<uint64_t> n = (*store)->Read(Key(1), absl::MakeSpan(b.data(), 1000));
  EXPECT_TRUE(absl::IsInvalidArgument(n.status()));
  EXPECT_THAT(n.status().message(), HasSubstr("at least SizeOf(key)"));
  n = (*store)->Read(Key(2), b.span());
  EXPECT_TRUE(absl::IsNotFound(n.status()));
  EXPECT_THAT(n.status().message(), HasSubstr(ShardKeyToString(Key(2))));
  EXPECT_TRUE(absl::IsNotFound((*store)->Delete(Key(2))));
}

TEST_F(ExtentStoreTest, OpenReportsMissingPathsAndSpaceWithNumbers) {
  options_.paths = {dir_->File("no-such-dir")};
  absl::StatusOr<std::unique_ptr<ExtentStore>> s = Open();
  EXPECT_TRUE(absl::IsNotFound(s.status()));
  EXPECT_THAT(s.status().message(), HasSubstr("no-such-dir"));

  options_.paths = {dir_->path()};
  options_.capacity_bytes_per_path = uint64_t{1} << 50;  // 1 PiB
  s = Open();
  EXPECT_TRUE(absl::IsResourceExhausted(s.status())) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr("need 1.0 PiB"));
  EXPECT_THAT(s.status().message(), HasSubstr("are free"));

  options_.capacity_bytes_per_path = 1000;
  EXPECT_TRUE(absl::IsInvalidArgument(Open().status()));
  options_.paths = {};
  EXPECT_TRUE(absl::IsInvalidArgument(Open().status()));
}

TEST_F(ExtentStoreTest, ShardsSpreadOverSeveralPaths) {
  TestDir second = *TestDir::Create("extent_store_b");
  options_.paths = {dir_->path(), second.path()};
  options_.capacity_bytes_per_path = 8 * kMiB;
  std::vector<AlignedBuffer> shards;
  {
    auto store = Open();
    ASSERT_TRUE(store.ok()) << store.status();
    // 12 MiB in all: more than one path holds.
    for (uint32_t t = 0; t < 12; ++t) {
      shards.push_back(Random(kMiB, t));
      ASSERT_TRUE((*store)->Write(Key(t), shards.back().span()).ok()) << t;
    }
    ASSERT_TRUE((*store)->Commit().ok());
    EXPECT_EQ((*store)->Stats().capacity_bytes, 16 * kMiB);
  }
  auto store = Open();
  ASSERT_TRUE(store.ok());
  for (uint32_t t = 0; t < 12; ++t) ExpectShard(**store, Key(t), shards[t], kMiB);
  // Paths in another order are refused rather than misread.
  options_.paths = {second.path(), dir_->path()};
  store->reset();
  EXPECT_TRUE(absl::IsFailedPrecondition(Open().status()));
}

TEST_F(ExtentStoreTest, ManifestIsCompactedAndStillReplays) {
  options_.manifest_compaction_min_bytes = 16 << 10;
  auto store = Open();
  ASSERT_TRUE(store.ok());
  AlignedBuffer b = Random(4096, 1);
  // Enough commits to pass the 16 KiB compaction threshold many times over.
  for (int i = 0; i < 1500; ++i) {
    ASSERT_TRUE((*store)->Write(Key(i % 3), b.span()).ok());
    if (i % 100 == 99) {
      ASSERT_TRUE((*store)->Sync().ok());
    }
  }
  ASSERT_TRUE((*store)->Commit().ok());
  store->reset();
  int fd = open(ManifestFile().c_str(), O_RDONLY);
  off_t size = lseek(fd, 0, SEEK_END);
  close(fd);
  EXPECT_LT(size, 16 << 10);
  auto again = Open();
  ASSERT_TRUE(again.ok()) << again.status();
  for (int t = 0; t < 3; ++t) ExpectShard(**again, Key(t), b, 4096);
}

TEST(ExtentStoreOptionsTest, PolicyAndChecksumNamesParse) {
  EXPECT_EQ(*ParseSyncPolicy("every_commit"), SyncPolicy::kEveryCommit);
  EXPECT_EQ(*ParseSyncPolicy("batched"), SyncPolicy::kBatched);
  EXPECT_EQ(*ParseSyncPolicy("never"), SyncPolicy::kNever);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseSyncPolicy("sometimes").status()));
  EXPECT_EQ(*ParseChecksumKind("crc32c"), ChecksumKind::kCrc32c);
  EXPECT_EQ(*ParseChecksumKind("xxh3"), ChecksumKind::kXxh3);
  EXPECT_TRUE(absl::IsInvalidArgument(ParseChecksumKind("md5").status()));
}

}  // namespace
}  // namespace strata
