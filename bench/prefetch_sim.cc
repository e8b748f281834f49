#include "bench/prefetch_sim.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "core/status_macros.h"
#include "prefetch/farthest_next_use_policy.h"
#include "prefetch/learned_predictor.h"
#include "prefetch/oracle_predictor.h"
#include "prefetch/prediction_trust.h"
#include "prefetch/prefetch_scheduler.h"
#include "tiers/device_tier.h"
#include "tiers/emulated_device.h"
#include "tiers/pinned_host_tier.h"
#include "tiers/tiered_store.h"
#include "tiers/transfer_executor.h"

namespace strata {
namespace {

// Real bytes per shard in the simulated store: one page, so a replay of
// thousands of accesses moves little memory while the model charges the
// configured shard size.
constexpr uint64_t kRealShardBytes = 4096;

}  // namespace

absl::string_view SimPolicyName(SimPolicy policy) {
  switch (policy) {
    case SimPolicy::kLru: return "lru";
    case SimPolicy::kPredictor: return "predictor";
    case SimPolicy::kBelady: return "belady";
  }
  return "?";
}

double SimResult::hit_rate() const {
  return accesses == 0 ? 0 : 1.0 - static_cast<double>(fetches) / static_cast<double>(accesses);
}

double SimResult::ready_rate() const {
  return accesses == 0 ? 0 : static_cast<double>(ready_accesses) / static_cast<double>(accesses);
}

double HitRateFrom(const GeneratedTrace& trace, const std::vector<uint64_t>& fetches_per_iteration,
                   size_t first) {
  if (first >= trace.iteration_starts.size()) return 0;
  const size_t accesses = trace.accesses.size() - trace.iteration_starts[first];
  uint64_t fetches = 0;
  for (size_t i = first; i < fetches_per_iteration.size(); ++i) fetches += fetches_per_iteration[i];
  return accesses == 0 ? 0 : 1.0 - static_cast<double>(fetches) / static_cast<double>(accesses);
}

double SimResult::hit_rate_from(const GeneratedTrace& trace, size_t first) const {
  return HitRateFrom(trace, fetches_per_iteration, first);
}

double SimResult::stall_fraction_from(size_t first) const {
  double stall = 0;
  double compute = 0;
  for (size_t i = first; i < stall_per_iteration.size(); ++i) {
    stall += stall_per_iteration[i];
    compute += compute_per_iteration[i];
  }
  return compute == 0 ? 0 : stall / compute;
}

size_t CapacityShards(const GeneratedTrace& trace, double fraction) {
  return std::max<size_t>(1, static_cast<size_t>(std::floor(fraction * trace.shards.size())));
}

absl::StatusOr<SimResult> RunSimulation(const GeneratedTrace& trace, SimPolicy policy,
                                        const SimConfig& config) {
  SimResult result;
  result.capacity_shards = CapacityShards(trace, config.capacity_fraction);
  const uint64_t device_bytes = result.capacity_shards * kRealShardBytes;

  FakeClock clock;
  STRATA_ASSIGN_OR_RETURN(auto device, EmulatedDevice::Create({.capacity_bytes = device_bytes}));
  STRATA_ASSIGN_OR_RETURN(auto device_tier,
                          DeviceTier::Create(device.get(), {.capacity_bytes = device_bytes}));
  STRATA_ASSIGN_OR_RETURN(
      auto home, PinnedHostTier::Create({.capacity_bytes = trace.shards.size() * kRealShardBytes,
                                         .lock = MemoryLockMode::kOff,
                                         .huge_pages = false,
                                         .name = "strata-bench-home"}));
  InlineExecutor executor;

  std::vector<ShardKey> sequence;
  sequence.reserve(trace.accesses.size());
  for (const TraceAccess& a : trace.accesses) sequence.push_back(a.key);
  std::optional<LearnedPredictor> learned;
  std::optional<OracleAccessPredictor> oracle;
  const AccessPredictor* predictor = nullptr;
  if (policy == SimPolicy::kPredictor) predictor = &learned.emplace();
  if (policy == SimPolicy::kBelady) predictor = &oracle.emplace(sequence);
  std::unique_ptr<PredictionTrust> trust;
  if (learned.has_value() && config.prediction_trust) {
    STRATA_ASSIGN_OR_RETURN(
        trust, PredictionTrust::Create({.capacity_shards = result.capacity_shards,
                                        .half_life_accesses = config.trust_half_life,
                                        .hysteresis_misses = config.trust_hysteresis}));
  }
  std::optional<FarthestNextUsePolicy> farthest;
  if (predictor != nullptr) farthest.emplace(predictor, trust.get());

  TieredStoreOptions store_options;
  store_options.clock = &clock;
  store_options.executor = &executor;
  store_options.policy = farthest.has_value() ? &*farthest : nullptr;
  STRATA_ASSIGN_OR_RETURN(auto store,
                          TieredStore::Create({device_tier.get(), home.get()}, store_options));
  const std::vector<std::byte> zeros(kRealShardBytes);
  for (const ShardKey& key : trace.shards) {
    STRATA_RETURN_IF_ERROR(store->AddShard(key, TierKind::kPinnedHost, zeros));
  }
  std::optional<PrefetchScheduler> scheduler;
  const double scale = static_cast<double>(config.shard_bytes) / kRealShardBytes;
  if (predictor != nullptr) {
    scheduler.emplace(store.get(), predictor,
                      PrefetchSchedulerOptions{
                          .tier = TierKind::kDevice,
                          .lookahead_count = config.lookahead_count,
                          .lookahead_bytes = static_cast<uint64_t>(
                              static_cast<double>(config.lookahead_bytes) / scale),
                          .max_in_flight = config.max_in_flight,
                          .urgent_distance = config.urgent_distance,
                          .adaptive_urgency = config.adaptive_urgency,
                          .write_backs_per_pump = config.write_backs_per_pump,
                          .trust = trust.get()});
  }

  // The link: one transfer at a time, in issue order.
  double now = 0;
  double link_free = 0;
  auto transfer_seconds = [&](uint64_t real_up, uint64_t real_down) {
    return static_cast<double>(real_up) * scale / config.read_bytes_per_second +
           static_cast<double>(real_down) * scale / config.write_bytes_per_second;
  };
  auto occupy_link = [&](double seconds) {
    const double start = std::max(now, link_free);
    link_free = start + seconds;
    result.link_busy_seconds += seconds;
    return link_free;
  };
  absl::flat_hash_map<ShardKey, double> ready_at;
  const double compute = absl::ToDoubleSeconds(config.compute_per_access);
  result.fetches_per_iteration.assign(trace.iteration_starts.size(), 0);
  result.stall_per_iteration.assign(trace.iteration_starts.size(), 0);
  result.compute_per_iteration.assign(trace.iteration_starts.size(), 0);
  size_t iteration = 0;
  auto pump = [&] {
    if (!scheduler.has_value()) return;
    for (const IssuedPrefetch& p : scheduler->Pump()) {
      const double done =
          occupy_link(transfer_seconds(p.transfer->bytes_up(), p.transfer->bytes_down()));
      if (!p.write_back) ready_at[p.key] = done;
    }
  };

  for (size_t i = 0; i < trace.accesses.size(); ++i) {
    if (iteration + 1 < trace.iteration_starts.size() &&
        trace.iteration_starts[iteration + 1] == i) {
      ++iteration;
      if (learned.has_value() && (config.mark_boundaries || iteration == 1)) {
        learned->MarkIterationBoundary();
      }
    }
    const TraceAccess& access = trace.accesses[i];
    // The trust measures the prediction as the policy sees it on this
    // access's miss: before the predictor learns the access.
    if (trust != nullptr) trust->OnAccess(access.key, *predictor);
    const uint64_t promotions_before = store->stats().tier(TierKind::kDevice).promotions;
    const double start = now;
    const bool resident = store->IsResident(access.key, TierKind::kDevice);
    const StoreStats before = store->stats();
    absl::StatusOr<Lease> lease = store->Acquire(
        access.key, TierKind::kDevice, access.write ? AccessMode::kWrite : AccessMode::kRead);
    if (!lease.ok()) return lease.status();
    if (resident) {
      auto it = ready_at.find(access.key);
      if (it != ready_at.end() && it->second > now) now = it->second;
    } else {
      // A demand miss: the promotion (and the write-backs it needed) ran
      // inside Acquire; charge it to the link and wait for it.
      const StoreStats after = store->stats();
      now = occupy_link(transfer_seconds(after.bytes_up - before.bytes_up,
                                         after.bytes_down - before.bytes_down));
      ready_at[access.key] = now;
    }
    result.stall_seconds += now - start;
    result.stall_per_iteration[iteration] += now - start;
    if (now == start) ++result.ready_accesses;

    if (learned.has_value()) learned->OnAccess(access.key);
    if (oracle.has_value()) oracle->Advance();
    pump();  // overlaps this access's compute
    now += compute;
    result.compute_seconds += compute;
    result.compute_per_iteration[iteration] += compute;
    STRATA_RETURN_IF_ERROR(store->Release(lease->id, access.write));
    pump();  // what waited for this access's shard to be released
    result.fetches_per_iteration[iteration] +=
        store->stats().tier(TierKind::kDevice).promotions - promotions_before;
  }

  const StoreStats stats = store->stats();
  result.accesses = trace.accesses.size();
  result.fetches = stats.tier(TierKind::kDevice).promotions;
  result.bytes_moved =
      static_cast<uint64_t>(static_cast<double>(stats.bytes_up + stats.bytes_down) * scale);
  result.prefetches_issued = stats.prefetches_issued;
  result.prefetches_used = stats.prefetches_used;
  result.prefetches_wasted = stats.prefetches_wasted;
  if (learned.has_value()) result.relearns = learned->stats().relearns;
  if (trust != nullptr) {
    result.trust_switches = trust->stats().switches;
    result.untrusted_accesses = trust->stats().untrusted_accesses;
  }
  STRATA_RETURN_IF_ERROR(store->CheckInvariants());
  return result;
}

}  // namespace strata
