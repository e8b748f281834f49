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

// The caller hashing (TryHashOne, Drain) races the hasher thread for every
// range; whoever wins, each sum must still see its ranges once, in order.
TEST(ChunkHasherTest, CallerAndHasherThreadShareTheQueueInOrder) {
  std::mt19937 rng(302);
  std::vector<unsigned char> data(2 << 20);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  ChunkHasher hasher;
  for (int round = 0; round < 20; ++round) {
    StreamingChecksum a(ChecksumKind::kXxh3, round), b(ChecksumKind::kCrc32c, round);
    size_t caller_hashed = 0;
    for (size_t off = 0; off < data.size(); off += 4099) {
      size_t n = std::min<size_t>(4099, data.size() - off);
      hasher.Add(&a, data.data() + off, n);
      hasher.Add(&b, data.data() + off, n);
      if (off % 3 == 0 && hasher.TryHashOne()) ++caller_hashed;
    }
    hasher.Drain();
    EXPECT_EQ(a.Digest(), ComputeChecksum(ChecksumKind::kXxh3, round, data.data(), data.size()));
    EXPECT_EQ(b.Digest(), ComputeChecksum(ChecksumKind::kCrc32c, round, data.data(), data.size()));
    EXPECT_LE(caller_hashed, 2 * (data.size() / 4099 + 1));
  }
  EXPECT_FALSE(hasher.TryHashOne());  // nothing queued
}

}  // namespace
}  // namespace strata
