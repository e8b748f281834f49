// CopyToSlot copies every byte, whatever the alignment and length, on both
// sides of the streaming threshold; CopyIntoRegion puts the same bytes into a
// memfd region whether its pages exist or not, and into a hole without a page
// fault per page.
#include "client/slot_copy.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(SlotCopyTest, CopiesExactlyTheBytesAtAnyAlignmentAndLength) {
  const size_t big = kStreamingCopyMinBytes + 4096 + 77;
  std::vector<uint8_t> src(big + 64), dst(big + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t dst_off : {0, 1, 17, 32, 63}) {
    for (size_t src_off : {0, 3, 32}) {
      for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, kStreamingCopyMinBytes - 1, kStreamingCopyMinBytes,
                       kStreamingCopyMinBytes + 63, big}) {
        std::fill(dst.begin(), dst.end(), 0xEE);
        CopyToSlot(dst.data() + dst_off, src.data() + src_off, n);
        for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xEE) << "wrote before the destination";
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(dst[dst_off + i], src[src_off + i]) << "byte " << i << " of " << n << " dst+" << dst_off;
        }
        for (size_t i = dst_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE) << "wrote past the end";
      }
    }
  }
}

long MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

TEST(SlotCopyTest, CopyIntoRegionWritesHolesWithoutFaultingAndResidentPagesAlike) {
  constexpr size_t kRegion = 8u << 20;
  const int fd = memfd_create("slot_copy_test", 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kRegion), 0);
  auto* region = static_cast<std::byte*>(mmap(nullptr, kRegion, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(region, MAP_FAILED);
  const size_t big = 2 * kStreamingCopyMinBytes + 4096 + 5;
  std::vector<uint8_t> src(big);
  for (size_t i = 0; i < big; ++i) src[i] = static_cast<uint8_t>(i * 29 + 1);
  auto check = [&](size_t at, size_t n, const char* what) {
    std::vector<uint8_t> back(n);
    ASSERT_EQ(pread(fd, back.data(), n, static_cast<off_t>(at)), static_cast<ssize_t>(n)) << what;
    EXPECT_EQ(std::memcmp(back.data(), src.data(), n), 0) << what << ": the memfd";
    EXPECT_EQ(std::memcmp(region + at, src.data(), n), 0) << what << ": the mapping";
  };
  // Into a hole (a discarded slot), at an unaligned offset: the bytes land
  // and this thread takes next to no faults (a store per 4 KiB page would
  // take one each: 514 here).
  const size_t at = 4096 * 3 + 17;
  long before = MinorFaults();
  ASSERT_TRUE(CopyIntoRegion(fd, region + at, at, src.data(), big).ok());
  const long hole_faults = MinorFaults() - before;
  EXPECT_LT(hole_faults, 64) << "the hole was written through the mapping";
  check(at, big, "into a hole");
  // Into the same, now resident pages (through the mapping), new bytes.
  for (auto& b : src) b = static_cast<uint8_t>(b ^ 0x5a);
  ASSERT_TRUE(CopyIntoRegion(fd, region + at, at, src.data(), big).ok());
  check(at, big, "into resident pages");
  // Small copies and no fd take the mapping; punched pages read back as zeros
  // around what was written.
  ASSERT_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, kRegion), 0);
  ASSERT_TRUE(CopyIntoRegion(fd, region + 100, 100, src.data(), 1000).ok());
  check(100, 1000, "small");
  EXPECT_EQ(region[99], std::byte{0});
  ASSERT_TRUE(CopyIntoRegion(-1, region + (4u << 20), 4u << 20, src.data(), big).ok());
  check(4u << 20, big, "without an fd");
  // A failed pwrite (an fd not open for writing) is an error, not a silent
  // short copy.
  const int read_only = open(absl::StrCat("/proc/self/fd/", fd).c_str(), O_RDONLY);
  ASSERT_GE(read_only, 0);
  ASSERT_EQ(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, kRegion), 0);
  absl::Status refused = CopyIntoRegion(read_only, region, 0, src.data(), big);
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("pwrite failed: errno"), std::string::npos) << refused;
  close(read_only);
  munmap(region, kRegion);
  close(fd);
}

}  // namespace
}  // namespace strata
