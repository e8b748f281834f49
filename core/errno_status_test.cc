#include "core/errno_status.h"

#include <cerrno>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(ErrnoToStatusTest, MapsCodesAndNamesTheObject) {
  absl::Status s = ErrnoToStatus(ENOENT, "opening /nvme/a.swp");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("opening /nvme/a.swp"), std::string::npos);
  EXPECT_NE(s.message().find("ENOENT"), std::string::npos);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EAGAIN, "x").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoToStatus(EINVAL, "x").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoToStatus(EIO, "x").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ErrnoToStatus(EOPNOTSUPP, "x").code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(ErrnoToStatus(EPERM, "x").code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace strata
