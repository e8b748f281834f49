#include "swap/chunk_hasher.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

TEST(ChunkHasherTest, MatchesInlineHashingInOrder) {
  std::mt19937 rng(301);
  std::vector<unsigned char> data(3 << 20);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  ChunkHasher hasher;
  for (ChecksumKind kind : {ChecksumKind::kXxh3, ChecksumKind::kCrc32c}) {
    StreamingChecksum a(kind, 9), b(kind, 11);
    for (size_t off = 0; off < data.size(); off += 100003) {
      size_t n = std::min<size_t>(100003, data.size() - off);
      hasher.Add(&a, data.data() + off, n);
      hasher.Add(&b, data.data() + off, n);
    }
    hasher.Drain();
    EXPECT_EQ(a.Digest(), ComputeChecksum(kind, 9, data.data(), data.size()));
    EXPECT_EQ(b.Digest(), ComputeChecksum(kind, 11, data.data(), data.size()));
  }
  hasher.Drain();  // idle: returns at once
}

}  // namespace
}  // namespace strata
