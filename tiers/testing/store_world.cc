#include "tiers/testing/store_world.h"

#include "core/status_macros.h"

namespace strata {

absl::StatusOr<std::unique_ptr<StoreWorld>> StoreWorld::Create(const StoreWorldOptions& options) {
  auto world = std::make_unique<StoreWorld>();
  EmulatedDeviceOptions device_options;
  device_options.capacity_bytes = options.device_bytes;
  STRATA_ASSIGN_OR_RETURN(world->device, EmulatedDevice::Create(device_options));
  STRATA_ASSIGN_OR_RETURN(world->device_tier,
                          DeviceTier::Create(world->device.get(),
                                             {.capacity_bytes = options.device_bytes}));
  STRATA_ASSIGN_OR_RETURN(world->pinned,
                          PinnedHostTier::Create({.capacity_bytes = options.home_bytes,
                                                  .lock = MemoryLockMode::kBestEffort}));
  world->home = std::make_unique<FaultInjectionTier>(world->pinned.get());
  if (options.executor_threads > 0) {
    STRATA_ASSIGN_OR_RETURN(world->executor, ThreadPoolExecutor::Create(options.executor_threads));
  } else {
    world->executor = std::make_unique<InlineExecutor>();
  }
  TieredStoreOptions store_options;
  store_options.clock = &world->clock;
  store_options.executor = world->executor.get();
  store_options.policy = options.policy;
  store_options.default_lease = absl::Seconds(60);
  STRATA_ASSIGN_OR_RETURN(world->store,
                          TieredStore::Create({world->device_tier.get(), world->home.get()},
                                              store_options));
  return world;
}

ShardKey TestKey(uint32_t tensor, uint64_t job) {
  return ShardKey{JobId(job), Rank(0), TensorId(tensor)};
}

std::vector<std::byte> Filled(size_t size, uint8_t value) {
  return std::vector<std::byte>(size, static_cast<std::byte>(value));
}

}  // namespace strata
