#include "tiers/pinned_arena.h"

#include <sys/mman.h>

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

constexpr uint64_t kPage = 4096;

// Pages of [p, p + bytes) resident in this process's view (mincore on a
// shared mapping reports the memfd's page cache).
uint64_t ResidentPages(std::byte* p, uint64_t bytes) {
  std::vector<unsigned char> vec(bytes / kPage);
  if (mincore(p, bytes, vec.data()) != 0) return UINT64_MAX;
  uint64_t n = 0;
  for (unsigned char v : vec) n += v & 1;
  return n;
}

PinnedArenaOptions Window(uint64_t bytes) {
  PinnedArenaOptions o;
  o.name = "strata-test-window";
  o.size_bytes = bytes;
  o.lock = MemoryLockMode::kBestEffort;
  o.huge_pages = false;  // 4 KiB pages, so the counts below are exact
  o.populate = false;
  return o;
}

TEST(PinnedArenaTest, APopulatedArenaHoldsEveryPage) {
  PinnedArenaOptions o = Window(64 * kPage);
  o.populate = true;
  auto arena = PinnedArena::Create(o);
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto resident = arena->ResidentBytes();
  ASSERT_TRUE(resident.ok()) << resident.status();
  EXPECT_EQ(*resident, 64 * kPage);
}

TEST(PinnedArenaTest, AWindowHoldsOnlyTheTouchedPagesAndDiscardFreesThem) {
  auto arena = PinnedArena::Create(Window(256 * kPage));
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_EQ(*arena->ResidentBytes(), 0u);
  EXPECT_EQ(ResidentPages(arena->data(), arena->size_bytes()), 0u);
  // Touch 32 pages at page 16.
  std::memset(arena->data() + 16 * kPage, 0x5a, 32 * kPage);
  EXPECT_EQ(*arena->ResidentBytes(), 32 * kPage);
  EXPECT_EQ(ResidentPages(arena->data(), arena->size_bytes()), 32u);
  // Give back the middle 8 of them.
  ASSERT_TRUE(arena->Discard(24 * kPage, 8 * kPage).ok());
  EXPECT_EQ(*arena->ResidentBytes(), 24 * kPage);
  EXPECT_EQ(ResidentPages(arena->data(), arena->size_bytes()), 24u);
  // Writing the hole again faults in fresh pages, zeroed.
  std::memset(arena->data() + 24 * kPage, 0x11, 16);
  EXPECT_EQ(*arena->ResidentBytes(), 25 * kPage);
  // The discarded range reads as zeros; the rest kept its bytes. (Reading a
  // hole of shared memory faults in pages too: the reads below bring the
  // other 7 pages of the hole back.)
  for (uint64_t i = 16 * kPage; i < 48 * kPage; ++i) {
    const bool hole = i >= 24 * kPage && i < 32 * kPage;
    const bool rewritten = i >= 24 * kPage && i < 24 * kPage + 16;
    ASSERT_EQ(static_cast<int>(arena->data()[i]), rewritten ? 0x11 : hole ? 0 : 0x5a) << "byte " << i;
  }
  EXPECT_EQ(*arena->ResidentBytes(), 32 * kPage);
  // Everything back.
  ASSERT_TRUE(arena->Discard(0, arena->size_bytes()).ok());
  EXPECT_EQ(*arena->ResidentBytes(), 0u);
  EXPECT_EQ(arena->size_bytes(), 256 * kPage);  // the size is kept
}

TEST(PinnedArenaTest, AWindowSharedThroughItsFdSeesTheHole) {
  auto arena = PinnedArena::Create(Window(16 * kPage));
  ASSERT_TRUE(arena.ok()) << arena.status();
  // A second mapping of the memfd, as a trainer has.
  void* other = mmap(nullptr, 16 * kPage, PROT_READ | PROT_WRITE, MAP_SHARED, arena->fd(), 0);
  ASSERT_NE(other, MAP_FAILED);
  auto* peer = static_cast<std::byte*>(other);
  std::memset(peer, 0x7f, 16 * kPage);  // the trainer faults the pages in
  EXPECT_EQ(*arena->ResidentBytes(), 16 * kPage);
  EXPECT_EQ(static_cast<int>(arena->data()[5 * kPage]), 0x7f);
  ASSERT_TRUE(arena->Discard(4 * kPage, 4 * kPage).ok());
  EXPECT_EQ(*arena->ResidentBytes(), 12 * kPage);
  EXPECT_EQ(static_cast<int>(peer[5 * kPage]), 0);
  EXPECT_EQ(static_cast<int>(peer[8 * kPage]), 0x7f);
  munmap(other, 16 * kPage);
}

TEST(PinnedArenaTest, DiscardRefusesUnalignedOrOutsideRanges) {
  auto arena = PinnedArena::Create(Window(8 * kPage));
  ASSERT_TRUE(arena.ok()) << arena.status();
  EXPECT_EQ(arena->Discard(1, kPage).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arena->Discard(0, kPage + 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arena->Discard(4 * kPage, 8 * kPage).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arena->Discard(9 * kPage, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(arena->Discard(UINT64_MAX - kPage + 1, 2 * kPage).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(arena->Discard(8 * kPage, 0).ok());
}

}  // namespace
}  // namespace strata
