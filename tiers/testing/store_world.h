// StoreWorld: a small, complete TieredStore for tests and benchmarks: an
// EmulatedDevice tier of a few shards over a pinned host home tier (wrapped
// in a FaultInjectionTier so tests can fail or hold its I/O), a FakeClock and
// a thread-pool executor.
#ifndef STRATA_TIERS_TESTING_STORE_WORLD_H_
#define STRATA_TIERS_TESTING_STORE_WORLD_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/clock.h"
#include "tiers/device_tier.h"
#include "tiers/emulated_device.h"
#include "tiers/eviction_policy.h"
#include "tiers/pinned_host_tier.h"
#include "tiers/testing/fault_injection_tier.h"
#include "tiers/tiered_store.h"
#include "tiers/transfer_executor.h"

namespace strata {

struct StoreWorldOptions {
  uint64_t device_bytes = 512 << 10;
  uint64_t home_bytes = 4 << 20;
  int executor_threads = 2;  // 0: inline
  EvictionPolicy* policy = nullptr;
};

struct StoreWorld {
  static absl::StatusOr<std::unique_ptr<StoreWorld>> Create(const StoreWorldOptions& options = {});

  FakeClock clock;
  std::unique_ptr<EmulatedDevice> device;
  std::unique_ptr<DeviceTier> device_tier;
  std::unique_ptr<PinnedHostTier> pinned;
  std::unique_ptr<FaultInjectionTier> home;  // over `pinned`
  std::unique_ptr<TransferExecutor> executor;
  std::unique_ptr<TieredStore> store;  // destroyed first (declared last)
};

// A shard key of job `job`, tensor `tensor`.
ShardKey TestKey(uint32_t tensor, uint64_t job = 1);
// `size` bytes, all equal to `value`.
std::vector<std::byte> Filled(size_t size, uint8_t value);

}  // namespace strata

#endif  // STRATA_TIERS_TESTING_STORE_WORLD_H_
