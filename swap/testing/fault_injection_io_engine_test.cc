#include "swap/testing/fault_injection_io_engine.h"

#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "swap/aligned_buffer.h"
#include "swap/direct_io.h"
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

}  // namespace
}  // namespace strata
