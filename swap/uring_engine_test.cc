// io_uring-only behaviour beyond the shared contract: SQPOLL and fixed
// buffers/files are used when asked for (or a note says why not).
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "swap/aligned_buffer.h"
#include "swap/direct_io.h"
#include "swap/io_engine.h"
#include "swap/testing/test_dir.h"

namespace strata {
namespace {

class UringEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<TestDir>(*TestDir::Create("uring_engine"));
    path_ = dir_->File("f");
    absl::StatusOr<OpenedFile> f = OpenForIo(path_, true, true, true);
    ASSERT_TRUE(f.ok()) << f.status();
    fd_ = f->fd;
    ASSERT_EQ(ftruncate(fd_, 4 << 20), 0);
  }
  void TearDown() override { close(fd_); }

  // Writes then reads 2 MiB through `e` and compares.
  void RoundTrip(IoEngine& e, bool register_buffers) {
    IoFileId id = *e.RegisterFile(fd_, path_);
    AlignedBuffer out = *AlignedBuffer::Allocate(2 << 20);
    AlignedBuffer in = *AlignedBuffer::Allocate(2 << 20);
    for (size_t i = 0; i < out.size(); ++i) out.data()[i] = static_cast<std::byte>(i * 131 + 7);
    if (register_buffers) {
      ASSERT_TRUE(e.RegisterBuffers({{out.data(), out.size()}, {in.data(), in.size()}}).ok());
    }
    for (IoOp op : {IoOp::kWrite, IoOp::kRead}) {
      IoRequest r{op, id, 1 << 20, op == IoOp::kWrite ? out.data() : in.data(), 2 << 20, 1};
      ASSERT_EQ(*e.Submit({r}), 1u);
      std::vector<IoCompletion> done;
      ASSERT_TRUE(e.Reap(1, absl::InfiniteDuration(), &done).ok());
      ASSERT_EQ(done.size(), 1u);
      ASSERT_TRUE(done[0].status.ok()) << done[0].status;
    }
    EXPECT_EQ(std::memcmp(in.data(), out.data(), out.size()), 0);
  }

  std::unique_ptr<TestDir> dir_;
  std::string path_;
  int fd_ = -1;
};

TEST_F(UringEngineTest, SqpollRingMovesDataOrSaysWhyNot) {
  IoEngineOptions o;
  o.queue_depth = 8;
  o.block_size_bytes = 256 << 10;
  o.sqpoll = true;
  absl::StatusOr<std::unique_ptr<IoEngine>> e = NewUringEngine(o);
  if (absl::IsUnimplemented(e.status())) GTEST_SKIP() << e.status();
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE((*e)->info().sqpoll || !(*e)->info().notes.empty());
  RoundTrip(**e, /*register_buffers=*/true);
}

TEST_F(UringEngineTest, FixedBuffersAndFilesAreUsedWhenAllowed) {
  IoEngineOptions o;
  o.queue_depth = 4;
  o.block_size_bytes = 128 << 10;
  absl::StatusOr<std::unique_ptr<IoEngine>> e = NewUringEngine(o);
  if (absl::IsUnimplemented(e.status())) GTEST_SKIP() << e.status();
  ASSERT_TRUE(e.ok()) << e.status();
  RoundTrip(**e, /*register_buffers=*/true);
  const IoEngineInfo& info = (*e)->info();
  // Either registered, or a note naming the reason (memlock, old kernel).
  EXPECT_TRUE(info.registered_buffers || !info.notes.empty());
  EXPECT_TRUE(info.registered_files || !info.notes.empty());
}

TEST_F(UringEngineTest, RegistrationCanBeTurnedOff) {
  IoEngineOptions o;
  o.register_buffers = false;
  o.register_files = false;
  absl::StatusOr<std::unique_ptr<IoEngine>> e = NewUringEngine(o);
  if (absl::IsUnimplemented(e.status())) GTEST_SKIP() << e.status();
  ASSERT_TRUE(e.ok()) << e.status();
  RoundTrip(**e, /*register_buffers=*/true);
  EXPECT_FALSE((*e)->info().registered_buffers);
  EXPECT_FALSE((*e)->info().registered_files);
}

TEST_F(UringEngineTest, RegisteringWhileRequestsAreOutstandingIsRefused) {
  absl::StatusOr<std::unique_ptr<IoEngine>> e = NewUringEngine(IoEngineOptions{});
  if (absl::IsUnimplemented(e.status())) GTEST_SKIP() << e.status();
  ASSERT_TRUE(e.ok());
  IoFileId id = *(*e)->RegisterFile(fd_, path_);
  AlignedBuffer b = *AlignedBuffer::Allocate(1 << 20);
  ASSERT_EQ(*(*e)->Submit({IoRequest{IoOp::kRead, id, 0, b.data(), 1 << 20, 1}}), 1u);
  EXPECT_TRUE(absl::IsFailedPrecondition((*e)->RegisterBuffers({{b.data(), b.size()}})));
  EXPECT_TRUE(absl::IsFailedPrecondition((*e)->RegisterFile(fd_, path_).status()));
  std::vector<IoCompletion> done;
  ASSERT_TRUE((*e)->Reap(1, absl::InfiniteDuration(), &done).ok());
  EXPECT_TRUE(done[0].status.ok());
}

}  // namespace
}  // namespace strata
