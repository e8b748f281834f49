#include "swap/checksum.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(Crc32cTest, MatchesTheStandardCheckValue) {
  const char* v = "123456789";
  EXPECT_EQ(Crc32cPortable(0, v, 9), 0xE3069283u);
  EXPECT_EQ(Crc32c(0, v, 9), 0xE3069283u);
}

TEST(Crc32cTest, HardwareMatchesPortableOnRandomData) {
  std::mt19937 rng(301);
  std::vector<unsigned char> data(100003);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (size_t len : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{4096}, data.size()}) {
    EXPECT_EQ(Crc32c(0, data.data(), len), Crc32cPortable(0, data.data(), len)) << len;
  }
  // Continuation equals one pass.
  uint32_t a = Crc32c(0, data.data(), 1000);
  EXPECT_EQ(Crc32c(a, data.data() + 1000, 5000), Crc32c(0, data.data(), 6000));
}

TEST(StreamingChecksumTest, PiecewiseEqualsOneShotForBothKinds) {
  std::mt19937 rng(7);
  std::vector<unsigned char> data(1 << 20);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (ChecksumKind kind : {ChecksumKind::kXxh3, ChecksumKind::kCrc32c}) {
    StreamingChecksum s(kind, 42);
    for (size_t off = 0; off < data.size(); off += 65536 + 3) {
      s.Update(data.data() + off, std::min<size_t>(65536 + 3, data.size() - off));
    }
    EXPECT_EQ(s.Digest(), ComputeChecksum(kind, 42, data.data(), data.size()));
  }
}

TEST(StreamingChecksumTest, SeedAndContentChangeTheDigest) {
  std::string d(4096, 'x');
  for (ChecksumKind kind : {ChecksumKind::kXxh3, ChecksumKind::kCrc32c}) {
    uint64_t base = ComputeChecksum(kind, 1, d.data(), d.size());
    EXPECT_NE(base, ComputeChecksum(kind, 2, d.data(), d.size()));
    std::string e = d;
    e[1234] ^= 1;
    EXPECT_NE(base, ComputeChecksum(kind, 1, e.data(), e.size()));
  }
}

}  // namespace
}  // namespace strata
