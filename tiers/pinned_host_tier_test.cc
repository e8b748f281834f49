#include "tiers/pinned_host_tier.h"

#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

ShardKey Key(uint32_t tensor) { return ShardKey{JobId(1), Rank(0), TensorId(tensor)}; }

TEST(PinnedHostTierTest, SlotsAreODirectAlignedAndVisibleThroughTheArenaFd) {
  auto tier = PinnedHostTier::Create({.capacity_bytes = 4 << 20});
  ASSERT_TRUE(tier.ok()) << tier.status();
  auto a = (*tier)->Allocate(Key(1), 100);
  auto b = (*tier)->Allocate(Key(2), 5000);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(b->offset_bytes % 4096, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*tier)->HostView(*b).data()) % 4096, 0u);
  std::vector<std::byte> in(5000, std::byte{0x33});
  ASSERT_TRUE((*tier)->Write(*b, in).ok());

  // A second mapping of the fd (what a trainer does after receiving it) sees
  // the same bytes at Locate()'s offset.
  const PinnedSlotLocation where = (*tier)->Locate(*b);
  void* other = mmap(nullptr, 4 << 20, PROT_READ, MAP_SHARED, (*tier)->arena_fd(), 0);
  ASSERT_NE(other, MAP_FAILED);
  EXPECT_EQ(std::memcmp(static_cast<std::byte*>(other) + where.offset_bytes, in.data(), in.size()),
            0);
  munmap(other, 4 << 20);

  std::vector<std::byte> out(5000);
  ASSERT_TRUE((*tier)->Read(*b, absl::MakeSpan(out)).ok());
  EXPECT_EQ(in, out);
}

TEST(PinnedHostTierTest, BestEffortLocksWhenTheLimitCanBeRaised) {
  auto tier = PinnedHostTier::Create({.capacity_bytes = 2 << 20});
  ASSERT_TRUE(tier.ok()) << tier.status();
  // Either locked, or the note names the limit; never silently neither.
  if (!(*tier)->arena().locked()) {
    EXPECT_NE((*tier)->arena().lock_note().find("RLIMIT_MEMLOCK"), std::string::npos);
  }
}

TEST(PinnedHostTierTest, RejectsCapacityThatIsNotPageMultiple) {
  EXPECT_EQ(PinnedHostTier::Create({.capacity_bytes = 5000}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// In a child process without CAP_SYS_RESOURCE and with RLIMIT_MEMLOCK at
// 64 KiB, a required lock of 1 MiB fails with a message naming the limit and
// the fix.
void LockBeyondLimitInChild() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &header, data) != 0) std::exit(2);
  data[CAP_SYS_RESOURCE / 32].effective &= ~(1u << (CAP_SYS_RESOURCE % 32));
  data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
  if (syscall(SYS_capset, &header, data) != 0) std::exit(3);
  rlimit limit{64 << 10, 64 << 10};
  if (setrlimit(RLIMIT_MEMLOCK, &limit) != 0) std::exit(4);
  auto tier = PinnedHostTier::Create({.capacity_bytes = 1 << 20, .lock = MemoryLockMode::kRequire});
  if (tier.ok()) std::exit(5);
  const std::string message(tier.status().message());
  std::fprintf(stderr, "%s\n", message.c_str());
  const bool named = tier.status().code() == absl::StatusCode::kResourceExhausted &&
                     message.find("RLIMIT_MEMLOCK is 64.0 KiB") != std::string::npos &&
                     message.find("ulimit -l") != std::string::npos;
  std::exit(named ? 0 : 6);
}

TEST(PinnedHostTierDeathTest, RequiredLockBeyondTheLimitNamesTheLimitAndTheFix) {
  EXPECT_EXIT(LockBeyondLimitInChild(), ::testing::ExitedWithCode(0), "RLIMIT_MEMLOCK");
}

}  // namespace
}  // namespace strata
