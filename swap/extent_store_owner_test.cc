// ExtentStore with several owners (jobs) at once: each commits only its own
// writes, rolls back or deletes only its own shards, and several threads may
// read, write and commit concurrently on several I/O lanes.
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "swap/aligned_buffer.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"
#include "swap/testing/fault_injection_io_engine.h"
#include "swap/testing/test_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;

ShardKey Key(uint64_t job, uint32_t tensor) {
  ShardKey k;
  k.job = JobId(job);
  k.rank = Rank(0);
  k.tensor = TensorId(tensor);
  k.kind = TensorKind::kExpAvg;
  return k;
}

// A shard whose bytes say which (job, tensor, version) wrote it.
AlignedBuffer Pattern(size_t size, uint64_t job, uint32_t tensor, uint64_t version) {
  AlignedBuffer b = *AlignedBuffer::Allocate(size);
  std::mt19937_64 rng(job * 1000003 + tensor * 1009 + version);
  for (size_t i = 0; i < size; ++i) b.data()[i] = static_cast<std::byte>(rng());
  return b;
}

class ExtentStoreOwnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TestDir>(*TestDir::Create("extent_store_owner"));
    IoEngineOptions eo;
    eo.queue_depth = 8;
    eo.block_size_bytes = 256 << 10;
    for (int i = 0; i < 4; ++i) {
      std::vector<std::string> notes;
      engines_.push_back(*OpenIoEngine(eo, std::nullopt, &notes));
    }
    options_.paths = {dir_->path()};
    options_.capacity_bytes_per_path = 64 * kMiB;
    options_.io_chunk_bytes = 256 << 10;
  }

  absl::StatusOr<std::unique_ptr<ExtentStore>> Open(size_t lanes = 1) {
    std::vector<IoEngine*> e;
    for (size_t i = 0; i < lanes; ++i) e.push_back(engines_[i].get());
    return ExtentStore::Open(options_, absl::MakeConstSpan(e));
  }

  static void Put(ExtentStore& store, uint64_t job, uint32_t tensor, uint64_t version, size_t size = 100000) {
    AlignedBuffer b = Pattern(size, job, tensor, version);
    ASSERT_TRUE(store.Write(Key(job, tensor), absl::MakeConstSpan(b.data(), size)).ok());
  }

  // The shard holds `version`'s bytes.
  static ::testing::AssertionResult Holds(ExtentStore& store, uint64_t job, uint32_t tensor, uint64_t version,
                                          size_t size = 100000) {
    AlignedBuffer got = *AlignedBuffer::Allocate(size);
    absl::StatusOr<uint64_t> n = store.Read(Key(job, tensor), got.span());
    if (!n.ok()) return ::testing::AssertionFailure() << n.status();
    AlignedBuffer want = Pattern(size, job, tensor, version);
    if (*n != size || std::memcmp(got.data(), want.data(), size) != 0) {
      return ::testing::AssertionFailure() << "job " << job << " tensor " << tensor << " is not version " << version;
    }
    return ::testing::AssertionSuccess();
  }

  std::unique_ptr<TestDir> dir_;
  std::vector<std::unique_ptr<IoEngine>> engines_;
  ExtentStoreOptions options_;
};

// Issue 11 item 4: one job's commit made another job's half-written step
// durable, so after kill -9 a job came back with some streams a step ahead.
TEST_F(ExtentStoreOwnerTest, CommitOfOneOwnerLeavesAnothersWritesUncommitted) {
  {
    auto store = Open();
    ASSERT_TRUE(store.ok()) << store.status();
    for (uint32_t t = 0; t < 3; ++t) {
      Put(**store, 1, t, 0);
      Put(**store, 2, t, 0);
    }
    ASSERT_TRUE((*store)->Commit(1).ok());
    ASSERT_TRUE((*store)->Commit(2).ok());
    // Job 2 is half way through its next step when job 1 commits its own.
    Put(**store, 2, 0, 1);
    Put(**store, 2, 1, 1);
    ASSERT_TRUE((*store)->Delete(Key(2, 2)).ok());
    for (uint32_t t = 0; t < 3; ++t) Put(**store, 1, t, 1);
    ASSERT_TRUE((*store)->Commit(1).ok());
    EXPECT_TRUE(Holds(**store, 2, 0, 1));  // readable at once, durable only at its own commit
  }  // kill -9
  auto store = Open();
  ASSERT_TRUE(store.ok()) << store.status();
  for (uint32_t t = 0; t < 3; ++t) {
    EXPECT_TRUE(Holds(**store, 1, t, 1));
    EXPECT_TRUE(Holds(**store, 2, t, 0)) << "job 2's uncommitted step leaked into job 1's commit";
  }
}

TEST_F(ExtentStoreOwnerTest, RollbackRestoresTheLastCommitAndFreesTheNewExtents) {
  auto store = Open();
  ASSERT_TRUE(store.ok());
  Put(**store, 1, 0, 0);
  Put(**store, 1, 1, 0);
  Put(**store, 2, 0, 0);
  ASSERT_TRUE((*store)->Commit().ok());
  const uint64_t used = (*store)->Stats().used_bytes;
  Put(**store, 1, 0, 1);
  Put(**store, 1, 0, 2);
  Put(**store, 1, 5, 0);
  ASSERT_TRUE((*store)->Delete(Key(1, 1)).ok());
  Put(**store, 2, 0, 1);
  (*store)->Rollback(1);
  EXPECT_TRUE(Holds(**store, 1, 0, 0));
  EXPECT_TRUE(Holds(**store, 1, 1, 0));
  EXPECT_FALSE((*store)->Contains(Key(1, 5)));
  EXPECT_TRUE(Holds(**store, 2, 0, 1));  // the other owner's pending write is untouched
  (*store)->Rollback(2);
  EXPECT_TRUE(Holds(**store, 2, 0, 0));
  EXPECT_EQ((*store)->Stats().used_bytes, used);
  // After a rollback, a commit of the owner holds only what came after it.
  Put(**store, 1, 0, 3);
  ASSERT_TRUE((*store)->Commit(1).ok());
  store->reset();
  store = Open();
  ASSERT_TRUE(store.ok());
  EXPECT_TRUE(Holds(**store, 1, 0, 3));
  EXPECT_TRUE(Holds(**store, 1, 1, 0));
  EXPECT_FALSE((*store)->Contains(Key(1, 5)));
}

// Issue 11 item 5: NVMe use must not grow with every run.
TEST_F(ExtentStoreOwnerTest, DeleteOwnerIsDurableAndUsageStaysConstantOverManyRuns) {
  auto store = Open();
  ASSERT_TRUE(store.ok());
  Put(**store, 1, 0, 0);
  ASSERT_TRUE((*store)->Commit(1).ok());
  const uint64_t used = (*store)->Stats().used_bytes;
  for (uint64_t run = 10; run < 40; ++run) {
    for (uint32_t t = 0; t < 4; ++t) Put(**store, run, t, 0);
    ASSERT_TRUE((*store)->Commit(run).ok());
    Put(**store, run, 0, 1);  // an uncommitted write too
    ASSERT_TRUE((*store)->DeleteOwner(run).ok());
    EXPECT_EQ((*store)->Stats().used_bytes, used) << "run " << run;
  }
  ASSERT_TRUE((*store)->DeleteOwner(99).ok());  // nothing to delete is fine
  store->reset();
  store = Open();
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Keys(), (std::vector<ShardKey>{Key(1, 0)}));
  EXPECT_EQ((*store)->Stats().used_bytes, used);
  EXPECT_TRUE(Holds(**store, 1, 0, 0));
}

TEST_F(ExtentStoreOwnerTest, ASecondStoreOnTheSamePathIsRefusedNamingThePid) {
  auto first = Open();
  ASSERT_TRUE(first.ok());
  auto second = Open();
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr(absl::StrCat("pid ", getpid())));
  first->reset();
  EXPECT_TRUE(Open().ok());  // the lock goes with the store
}

TEST_F(ExtentStoreOwnerTest, GenerationGrowsWithEveryWrite) {
  auto store = Open();
  ASSERT_TRUE(store.ok());
  Put(**store, 1, 0, 0);
  auto g1 = (*store)->GenerationOf(Key(1, 0));
  Put(**store, 1, 0, 1);
  auto g2 = (*store)->GenerationOf(Key(1, 0));
  ASSERT_TRUE(g1.ok() && g2.ok());
  EXPECT_LT(*g1, *g2);
  EXPECT_TRUE(absl::IsNotFound((*store)->GenerationOf(Key(1, 9)).status()));
}

// Several jobs write, read back, commit and roll back at once on four lanes;
// a reader of a shard that is being replaced never sees reused bytes.
TEST_F(ExtentStoreOwnerTest, ConcurrentOwnersReadWriteAndCommitSafely) {
  auto opened = Open(4);
  ASSERT_TRUE(opened.ok());
  ExtentStore& store = **opened;
  constexpr int kJobs = 4;
  constexpr uint32_t kTensors = 3;
  constexpr int kRounds = 25;
  std::vector<uint64_t> committed(kJobs + 1, 0);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (uint64_t job = 1; job <= kJobs; ++job) {
    threads.emplace_back([&, job] {
      const size_t size = 50000 + job * 30000;
      for (uint64_t v = 0; v < static_cast<uint64_t>(kRounds); ++v) {
        for (uint32_t t = 0; t < kTensors; ++t) {
          AlignedBuffer b = Pattern(size, job, t, v);
          if (!store.Write(Key(job, t), absl::MakeConstSpan(b.data(), size)).ok()) ++failures;
        }
        for (uint32_t t = 0; t < kTensors; ++t) {
          if (!Holds(store, job, t, v, size)) ++failures;
        }
        if (v % 5 == 4) {
          store.Rollback(job);  // this round is thrown away
          for (uint32_t t = 0; t < kTensors && v >= 5; ++t) {
            if (!Holds(store, job, t, committed[job], size)) ++failures;
          }
          continue;
        }
        if (!store.Commit(job).ok()) ++failures;
        committed[job] = v;
      }
    });
  }
  // Readers of another job's shards race with its replacements.
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    AlignedBuffer buf = *AlignedBuffer::Allocate(1 << 20);
    while (!stop) {
      for (uint64_t job = 1; job <= kJobs; ++job) {
        auto n = store.Read(Key(job, 0), buf.span());
        if (!n.ok() && !absl::IsNotFound(n.status())) ++failures;
      }
    }
  });
  for (std::thread& t : threads) t.join();
  stop = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0);
  opened->reset();
  auto reopened = Open(2);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  for (uint64_t job = 1; job <= kJobs; ++job) {
    for (uint32_t t = 0; t < kTensors; ++t) {
      EXPECT_TRUE(Holds(**reopened, job, t, committed[job], 50000 + job * 30000));
    }
  }
}

// The store tags every request with its shard's owner, so a fault aimed at
// one job (tests/faults/) never touches another's shards, and a failed write
// leaves the owner's previous version readable.
TEST_F(ExtentStoreOwnerTest, RequestsCarryTheirOwnerSoFaultsHitOneJob) {
  FaultPolicy policy;
  policy.rules.push_back(FaultRule::OnNth(FaultKind::kEio, 1, IoOp::kWrite));
  policy.rules.back().only_tag = 7;
  policy.rules.back().run = 1000;
  FaultInjectionIoEngine faulty(engines_[0].get(), policy);
  IoEngine* lanes[] = {&faulty};
  auto store = ExtentStore::Open(options_, absl::MakeConstSpan(lanes));
  ASSERT_TRUE(store.ok()) << store.status();
  Put(**store, 8, 0, 0);
  AlignedBuffer b = Pattern(100000, 7, 0, 0);
  absl::Status s = (*store)->Write(Key(7, 0), absl::MakeConstSpan(b.data(), 100000));
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("Input/output error"));
  EXPECT_FALSE((*store)->Contains(Key(7, 0)));
  Put(**store, 8, 1, 0);
  EXPECT_TRUE(Holds(**store, 8, 0, 0));
  EXPECT_TRUE(Holds(**store, 8, 1, 0));
  EXPECT_GT(faulty.schedule().fired(FaultKind::kEio), 0u);
}

}  // namespace
}  // namespace strata
