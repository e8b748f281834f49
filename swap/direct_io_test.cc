#include "swap/direct_io.h"

#include <unistd.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "swap/testing/test_dir.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

TEST(DirectIoTest, ProbedAlignmentIsAPowerOfTwo) {
  absl::StatusOr<TestDir> dir = TestDir::Create("direct_io");
  ASSERT_TRUE(dir.ok());
  absl::StatusOr<OpenedFile> f = OpenForIo(dir->File("f"), true, true, true);
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<DirectIoAlignment> a = ProbeDirectIoAlignment(f->fd, dir->File("f"));
  ASSERT_TRUE(a.ok()) << a.status();
  uint32_t r = a->required();
  EXPECT_GE(r, 1u);
  EXPECT_LE(r, 65536u);
  EXPECT_EQ(r & (r - 1), 0u);
  EXPECT_EQ(*IsDirectIo(f->fd, "f"), f->direct);
  close(f->fd);
}

TEST(DirectIoTest, MisalignmentMessagesStateTheRule) {
  alignas(4096) static char buf[8192];
  EXPECT_TRUE(CheckDirectIoAlignment("/x", 512, buf, 512, 1024).ok());
  absl::Status s = CheckDirectIoAlignment("/x", 512, buf + 1, 0, 512);
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(s.message(), HasSubstr("buffer address"));
  EXPECT_THAT(s.message(), HasSubstr("O_DIRECT alignment of /x: align buffer addresses, offsets and lengths to 512 bytes"));
  s = CheckDirectIoAlignment("/x", 512, buf, 100, 512);
  EXPECT_THAT(s.message(), HasSubstr("offset 100 is not a multiple of 512"));
  s = CheckDirectIoAlignment("/x", 512, buf, 0, 513);
  EXPECT_THAT(s.message(), HasSubstr("length 513 is not a multiple of 512"));
  EXPECT_TRUE(CheckDirectIoAlignment("/x", 1, buf + 1, 3, 5).ok());
}

TEST(DirectIoTest, BufferedOpenIsNotDirect) {
  absl::StatusOr<TestDir> dir = TestDir::Create("direct_io");
  ASSERT_TRUE(dir.ok());
  absl::StatusOr<OpenedFile> f = OpenForIo(dir->File("b"), true, false, false);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->direct);
  EXPECT_FALSE(*IsDirectIo(f->fd, "b"));
  close(f->fd);
}

TEST(DirectIoTest, MissingFileWithoutCreateIsNotFound) {
  absl::StatusOr<TestDir> dir = TestDir::Create("direct_io");
  ASSERT_TRUE(dir.ok());
  absl::StatusOr<OpenedFile> f = OpenForIo(dir->File("absent"), false, true, false);
  EXPECT_TRUE(absl::IsNotFound(f.status())) << f.status();
  EXPECT_THAT(f.status().message(), HasSubstr("absent"));
}

}  // namespace
}  // namespace strata
