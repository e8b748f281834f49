// Many client threads acquire, write, release, promote and demote at random
// while a checker verifies the store's invariants; at the end every shard
// holds exactly the last value written to it.
#include <atomic>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tiers/testing/store_world.h"
#include "tiers/tiered_store.h"

namespace strata {
namespace {

constexpr size_t kShard = 32 << 10;
constexpr int kShards = 24;   // 768 KiB of data over a 256 KiB device tier
constexpr int kThreads = 8;
constexpr int kOpsPerThread = 800;

bool Uniform(absl::Span<const std::byte> bytes, std::byte value) {
  for (std::byte b : bytes) {
    if (b != value) return false;
  }
  return true;
}

TEST(TieredStoreConcurrencyTest, RandomClientsKeepInvariantsAndLoseNoWrite) {
  auto world_or = StoreWorld::Create({.device_bytes = 256 << 10, .home_bytes = 2 << 20,
                                      .executor_threads = 3});
  ASSERT_TRUE(world_or.ok()) << world_or.status();
  StoreWorld& world = **world_or;
  TieredStore& store = *world.store;
  ASSERT_TRUE(store.SetJobBudget(JobId(2), TierKind::kDevice, 96 << 10).ok());

  // Clients of one shard coordinate among themselves (as ZeRO ranks do):
  // the store does not serialize its clients' reads and writes, only its own
  // transfers against writers. (Readers once skipped this; TSan saw them
  // read a shard another client was writing.)
  std::vector<std::shared_mutex> client_lock(kShards);
  std::vector<uint8_t> last_value(kShards);
  auto key = [](int i) { return TestKey(i, 1 + i % 2); };
  for (int i = 0; i < kShards; ++i) {
    last_value[i] = static_cast<uint8_t>(i);
    ASSERT_TRUE(store.AddShard(key(i), TierKind::kPinnedHost, Filled(kShard, i)).ok());
  }

  std::atomic<bool> done{false};
  std::atomic<int> violations{0};
  std::thread checker([&] {
    while (!done.load(std::memory_order_acquire)) {
      if (!store.CheckInvariants().ok()) violations.fetch_add(1);
    }
  });

  std::atomic<int> unexpected{0};
  std::atomic<int> torn{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < kThreads; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(301 + c);
      std::vector<std::byte> buffer(kShard);
      for (int op = 0; op < kOpsPerThread; ++op) {
        const int i = static_cast<int>(rng() % kShards);
        const TierKind tier = rng() % 4 == 0 ? TierKind::kPinnedHost : TierKind::kDevice;
        const int what = static_cast<int>(rng() % 10);
        if (what < 5) {  // read
          std::shared_lock<std::shared_mutex> guard(client_lock[i]);
          auto lease = store.Acquire(key(i), tier, AccessMode::kRead);
          if (!lease.ok()) {
            if (!absl::IsResourceExhausted(lease.status())) unexpected.fetch_add(1);
            continue;
          }
          if (!store.ReadShard(*lease, absl::MakeSpan(buffer)).ok()) unexpected.fetch_add(1);
          if (!store.Release(lease->id, false).ok()) unexpected.fetch_add(1);
        } else if (what < 8) {  // write
          std::unique_lock<std::shared_mutex> guard(client_lock[i]);
          auto lease = store.Acquire(key(i), tier, AccessMode::kWrite);
          if (!lease.ok()) {
            if (!absl::IsResourceExhausted(lease.status())) unexpected.fetch_add(1);
            continue;
          }
          // Never torn: this writer holds client_lock[i] exclusively.
          if (!store.ReadShard(*lease, absl::MakeSpan(buffer)).ok() ||
              !Uniform(buffer, static_cast<std::byte>(last_value[i]))) {
            torn.fetch_add(1);
          }
          const uint8_t value = static_cast<uint8_t>(rng());
          if (!store.WriteShard(*lease, Filled(kShard, value)).ok()) unexpected.fetch_add(1);
          last_value[i] = value;
          if (!store.Release(lease->id, true).ok()) unexpected.fetch_add(1);
        } else if (what < 9) {  // prefetch
          auto t = store.Promote(key(i), TierKind::kDevice, {.prefetch = true});
          if (t.ok()) {
            absl::Status s = (*t)->Wait();
            if (!s.ok() && !absl::IsResourceExhausted(s)) unexpected.fetch_add(1);
          } else if (!absl::IsResourceExhausted(t.status()) && !absl::IsUnavailable(t.status())) {
            unexpected.fetch_add(1);
          }
        } else {  // demote
          auto t = store.Demote(key(i), TierKind::kPinnedHost);
          if (t.ok()) {
            if (!(*t)->Wait().ok()) unexpected.fetch_add(1);
          } else if (!absl::IsFailedPrecondition(t.status())) {
            unexpected.fetch_add(1);
          }
        }
      }
    });
  }
  for (std::thread& t : clients) t.join();
  done.store(true, std::memory_order_release);
  checker.join();

  EXPECT_EQ(violations.load(), 0);
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_EQ(torn.load(), 0);
  ASSERT_TRUE(store.CheckInvariants().ok()) << store.CheckInvariants();
  EXPECT_LE(store.charged_bytes(TierKind::kDevice), 256u << 10);
  EXPECT_LE(store.job_charged_bytes(JobId(2), TierKind::kDevice), 96u << 10);
  const StoreStats stats = store.stats();
  EXPECT_GT(stats.tier(TierKind::kDevice).evictions, 0u);
  EXPECT_GT(stats.tier(TierKind::kDevice).write_backs, 0u);
  // No shard lost: each reads back, from its home, as the last value written.
  std::vector<std::byte> buffer(kShard);
  for (int i = 0; i < kShards; ++i) {
    auto lease = store.Acquire(key(i), TierKind::kPinnedHost, AccessMode::kRead);
    ASSERT_TRUE(lease.ok()) << lease.status();
    ASSERT_TRUE(store.ReadShard(*lease, absl::MakeSpan(buffer)).ok());
    EXPECT_TRUE(Uniform(buffer, static_cast<std::byte>(last_value[i]))) << "shard " << i;
    ASSERT_TRUE(store.Release(lease->id, false).ok());
  }
}

}  // namespace
}  // namespace strata
