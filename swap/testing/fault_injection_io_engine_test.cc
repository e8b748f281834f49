#include "swap/testing/fault_injection_io_engine.h"

#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "swap/aligned_buffer.h"
#include "swap/direct_io.h"
#include "swap/testing/fault_plan.h"
#include "swap/testing/test_dir.h"

namespace strata {
namespace {

class FaultInjectionIoEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TestDir>(*TestDir::Create("fault_engine"));
    path_ = dir_->File("f");
    OpenedFile f = *OpenForIo(path_, true, true, true);
    fd_ = f.fd;
    ASSERT_EQ(ftruncate(fd_, 1 << 20), 0);
    IoEngineOptions o;
    o.queue_depth = 4;
    o.block_size_bytes = 64 << 10;
    inner_ = *NewPsyncEngine(o);
  }
  void TearDown() override {
    inner_.reset();
    close(fd_);
  }

  std::vector<IoCompletion> Run(IoEngine& e, std::vector<IoRequest> reqs) {
    EXPECT_EQ(*e.Submit(reqs), reqs.size());
    std::vector<IoCompletion> out;
    while (out.size() < reqs.size()) EXPECT_TRUE(e.Reap(reqs.size() - out.size(), absl::InfiniteDuration(), &out).ok());
    return out;
  }

  std::unique_ptr<TestDir> dir_;
  std::string path_;
  int fd_ = -1;
  std::unique_ptr<IoEngine> inner_;
};

TEST_F(FaultInjectionIoEngineTest, TornWriteLeavesOnlyThePrefix) {
  FaultPolicy p;
  p.rules.push_back(FaultRule::OnNth(FaultKind::kTornWrite, 1, IoOp::kWrite));
  p.rules.back().torn_bytes = 8192;
  FaultInjectionIoEngine e(inner_.get(), p);
  IoFileId id = *e.RegisterFile(fd_, path_);
  AlignedBuffer ones = *AlignedBuffer::Allocate(65536);
  std::memset(ones.data(), 1, ones.size());
  std::vector<IoCompletion> done = Run(e, {IoRequest{IoOp::kWrite, id, 0, ones.data(), 65536, 5}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].user_data, 5u);
  EXPECT_TRUE(absl::IsDataLoss(done[0].status)) << done[0].status;
  EXPECT_THAT(done[0].status.message(), ::testing::HasSubstr("torn after 8192 bytes"));
  AlignedBuffer back = *AlignedBuffer::Allocate(65536);
  done = Run(e, {IoRequest{IoOp::kRead, id, 0, back.data(), 65536, 6}});
  ASSERT_TRUE(done[0].status.ok());
  EXPECT_EQ(back.data()[8191], std::byte{1});
  EXPECT_EQ(back.data()[8192], std::byte{0});
}

TEST_F(FaultInjectionIoEngineTest, NthErrorHitsExactlyThatRequest) {
  FaultPolicy p;
  p.rules.push_back(FaultRule::OnNth(FaultKind::kEio, 2));
  FaultInjectionIoEngine e(inner_.get(), p);
  IoFileId id = *e.RegisterFile(fd_, path_);
  AlignedBuffer b = *AlignedBuffer::Allocate(3 * 4096);
  std::vector<IoCompletion> done = Run(e, {IoRequest{IoOp::kRead, id, 0, b.data(), 4096, 0},
                                           IoRequest{IoOp::kRead, id, 4096, b.data() + 4096, 4096, 1},
                                           IoRequest{IoOp::kRead, id, 8192, b.data() + 8192, 4096, 2}});
  ASSERT_EQ(done.size(), 3u);
  for (const IoCompletion& c : done) {
    EXPECT_EQ(c.status.ok(), c.user_data != 1) << c.user_data << " " << c.status;
  }
  EXPECT_EQ(e.schedule().fired(FaultKind::kEio), 1u);
}

TEST_F(FaultInjectionIoEngineTest, DelayAdvancesTheInjectedClock) {
  FaultPolicy p;
  p.rules.push_back(FaultRule::OnNth(FaultKind::kDelay, 1));
  p.rules.back().delay = absl::Seconds(3);
  FakeClock clock;
  FaultInjectionIoEngine e(inner_.get(), p, &clock);
  IoFileId id = *e.RegisterFile(fd_, path_);
  AlignedBuffer b = *AlignedBuffer::Allocate(4096);
  absl::Time t0 = clock.Now();
  std::vector<IoCompletion> done = Run(e, {IoRequest{IoOp::kRead, id, 0, b.data(), 4096, 0}});
  EXPECT_TRUE(done[0].status.ok());
  EXPECT_EQ(clock.Now() - t0, absl::Seconds(3));
}

TEST_F(FaultInjectionIoEngineTest, RandomFaultsRepeatWithTheSameSeed) {
  auto pattern = [&](uint64_t seed) {
    FaultPolicy p;
    p.seed = seed;
    p.rules.push_back(FaultRule::Randomly(FaultKind::kEio, 0.3));
    FaultSchedule s(p);
    std::vector<bool> fired;
    for (int i = 0; i < 64; ++i) fired.push_back(s.Next(IoOp::kRead).has_value());
    return fired;
  };
  EXPECT_EQ(pattern(1), pattern(1));
  EXPECT_NE(pattern(1), pattern(2));
}

TEST_F(FaultInjectionIoEngineTest, AfterCrashWritesAreDroppedAndReadsWork) {
  FaultInjectionIoEngine e(inner_.get(), FaultPolicy{});
  IoFileId id = *e.RegisterFile(fd_, path_);
  AlignedBuffer b = *AlignedBuffer::Allocate(4096);
  std::memset(b.data(), 9, 4096);
  e.SimulateCrash();
  std::vector<IoCompletion> done = Run(e, {IoRequest{IoOp::kWrite, id, 0, b.data(), 4096, 0},
                                           IoRequest{IoOp::kRead, id, 0, b.data(), 4096, 1}});
  for (const IoCompletion& c : done) {
    if (c.user_data == 0) {
      EXPECT_TRUE(absl::IsUnavailable(c.status));
    }
    if (c.user_data == 1) {
      EXPECT_TRUE(c.status.ok());
    }
  }
  EXPECT_EQ(b.data()[0], std::byte{0});  // the read saw the untouched file
}

// A rule with only_tag hits only requests carrying that tag (a job's
// extents): the harness's guarantee that other jobs are untouched.
TEST_F(FaultInjectionIoEngineTest, OnlyTagScopesFaultsToOneOwner) {
  FaultPolicy p;
  p.rules.push_back(FaultRule::OnNth(FaultKind::kEio, 1, IoOp::kWrite));
  p.rules.back().only_tag = 7;
  p.rules.back().run = 2;
  FaultInjectionIoEngine e(inner_.get(), p);
  IoFileId id = *e.RegisterFile(fd_, path_);
  AlignedBuffer buf = *AlignedBuffer::Allocate(4096);
  std::memset(buf.data(), 3, buf.size());
  std::vector<IoCompletion> done =
      Run(e, {IoRequest{IoOp::kWrite, id, 0, buf.data(), 4096, 1, /*tag=*/8},
              IoRequest{IoOp::kWrite, id, 4096, buf.data(), 4096, 2, /*tag=*/7},
              IoRequest{IoOp::kWrite, id, 8192, buf.data(), 4096, 3, /*tag=*/8},
              IoRequest{IoOp::kWrite, id, 12288, buf.data(), 4096, 4, /*tag=*/7},
              IoRequest{IoOp::kWrite, id, 16384, buf.data(), 4096, 5, /*tag=*/7}});
  std::map<uint64_t, absl::Status> by_id;
  for (const IoCompletion& c : done) by_id[c.user_data] = c.status;
  EXPECT_TRUE(by_id[1].ok());
  EXPECT_TRUE(absl::IsDataLoss(by_id[2])) << by_id[2];
  EXPECT_TRUE(by_id[3].ok());
  EXPECT_TRUE(absl::IsDataLoss(by_id[4])) << by_id[4];  // run = 2
  EXPECT_TRUE(by_id[5].ok());
  EXPECT_EQ(e.schedule().fired(FaultKind::kEio), 2u);
}

// A silent tear reports success, and only the prefix reached the file.
TEST_F(FaultInjectionIoEngineTest, SilentTornWriteReportsSuccess) {
  FaultPolicy p;
  p.rules.push_back(FaultRule::OnNth(FaultKind::kTornWrite, 1, IoOp::kWrite));
  p.rules.back().torn_bytes = 4096;
  p.rules.back().torn_silent = true;
  FaultInjectionIoEngine e(inner_.get(), p);
  IoFileId id = *e.RegisterFile(fd_, path_);
  AlignedBuffer ones = *AlignedBuffer::Allocate(16384);
  std::memset(ones.data(), 1, ones.size());
  std::vector<IoCompletion> done = Run(e, {IoRequest{IoOp::kWrite, id, 0, ones.data(), 16384, 1}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_TRUE(done[0].status.ok()) << done[0].status;
  EXPECT_EQ(done[0].transferred_bytes, 16384u);
  AlignedBuffer back = *AlignedBuffer::Allocate(16384);
  std::vector<IoCompletion> read = Run(*inner_, {IoRequest{IoOp::kRead, id, 0, back.data(), 16384, 2}});
  ASSERT_TRUE(read[0].status.ok());
  EXPECT_EQ(std::to_integer<int>(back.data()[4095]), 1);
  EXPECT_EQ(std::to_integer<int>(back.data()[4096]), 0);  // the lost tail
}

// Kernel-level short transfers, scoped by tag through InFlightTags: the
// engine resubmits the rest, so the data is whole and the request OK.
TEST_F(FaultInjectionIoEngineTest, ScopedShortTransfersAreResubmittedByTheEngine) {
  FaultPlan plan = *ParseFaultPlan("tag=9,op=write,kind=short,after=1,run=4");
  FaultPlanEngines faults(plan);
  IoEngineOptions o;
  o.queue_depth = 4;
  o.block_size_bytes = 64 << 10;
  o.result_hook = faults.result_hook();
  std::unique_ptr<IoEngine> e = faults.Wrap(*NewPsyncEngine(o));
  IoFileId id = *e->RegisterFile(fd_, path_);
  AlignedBuffer twos = *AlignedBuffer::Allocate(65536);
  std::memset(twos.data(), 2, twos.size());
  std::vector<IoCompletion> done = Run(*e, {IoRequest{IoOp::kWrite, id, 0, twos.data(), 65536, 1, /*tag=*/3},
                                            IoRequest{IoOp::kWrite, id, 65536, twos.data(), 65536, 2, /*tag=*/9}});
  for (const IoCompletion& c : done) EXPECT_TRUE(c.status.ok()) << c.status;
  EXPECT_THAT(faults.Summary(), ::testing::HasSubstr("short (applied) 4"));
  AlignedBuffer back = *AlignedBuffer::Allocate(131072);
  std::vector<IoCompletion> read = Run(*e, {IoRequest{IoOp::kRead, id, 0, back.data(), 131072, 3}});
  ASSERT_TRUE(read[0].status.ok());
  for (size_t i = 0; i < 131072; ++i) ASSERT_EQ(std::to_integer<int>(back.data()[i]), 2) << i;
}

TEST(FaultPlanTest, ParsesRulesAndRefusesPlansWithoutOneJob) {
  absl::StatusOr<FaultPlan> plan = ParseFaultPlan("tag=5,op=read,kind=eio,after=3; tag=5,kind=short,run=2");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->request_level.rules.size(), 1u);
  EXPECT_EQ(plan->request_level.rules[0].nth, 3u);
  EXPECT_EQ(*plan->request_level.rules[0].only_tag, 5u);
  EXPECT_EQ(*plan->request_level.rules[0].only_op, IoOp::kRead);
  ASSERT_EQ(plan->kernel_level.rules.size(), 1u);
  EXPECT_EQ(plan->kernel_level.rules[0].run, 2u);
  EXPECT_THAT(ParseFaultPlan("op=write,kind=eio").status().message(), ::testing::HasSubstr("tag=<job id>"));
  EXPECT_THAT(ParseFaultPlan("tag=1,kind=boom").status().message(), ::testing::HasSubstr("kind must be"));
  EXPECT_THAT(ParseFaultPlan("tag=1,kind=torn,op=read").status().message(), ::testing::HasSubstr("op=write"));
  EXPECT_THAT(ParseFaultPlan("tag=1,kind=eio,after=0").status().message(), ::testing::HasSubstr("after>=1"));
  EXPECT_FALSE(ParseFaultPlan("").ok());
}

}  // namespace
}  // namespace strata
