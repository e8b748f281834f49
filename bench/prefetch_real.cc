#include "bench/prefetch_real.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/clock.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "prefetch/farthest_next_use_policy.h"
#include "prefetch/learned_predictor.h"
#include "prefetch/prediction_trust.h"
#include "prefetch/oracle_predictor.h"
#include "prefetch/prefetch_scheduler.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"
#include "tiers/device_tier.h"
#include "tiers/emulated_device.h"
#include "tiers/nvme_tier.h"
#include "tiers/tiered_store.h"
#include "tiers/transfer_executor.h"

namespace strata {
namespace {

struct RealResult {
  uint64_t accesses = 0;
  uint64_t fetches = 0;
  uint64_t bytes_moved = 0;
  double stall_seconds = 0;
  double compute_seconds = 0;
  double wall_seconds = 0;
  uint64_t prefetches_issued = 0;
  uint64_t prefetches_wasted = 0;
};

// Emulated compute: a busy wait, so the time is spent even when the
// scheduler would otherwise oversleep a short SleepFor.
void Compute(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
  }
}

absl::StatusOr<RealResult> RunOne(const GeneratedTrace& trace, SimPolicy policy,
                                  const SimConfig& config, const RealBenchOptions& options,
                                  IoEngine* engine, const std::string& dir) {
  const uint64_t shard = static_cast<uint64_t>(options.shard_kib) << 10;
  const size_t slots = CapacityShards(trace, config.capacity_fraction);
  const uint64_t device_bytes = slots * shard;
  ExtentStoreOptions eo;
  eo.paths = {dir};
  eo.capacity_bytes_per_path = 2 * trace.shards.size() * shard + (64ull << 20);
  eo.sync_policy = SyncPolicy::kNever;
  eo.allow_buffered_fallback = true;
  STRATA_ASSIGN_OR_RETURN(auto extents, ExtentStore::Open(eo, engine));
  for (const ShardKey& key : extents->Keys()) STRATA_RETURN_IF_ERROR(extents->Delete(key));
  STRATA_ASSIGN_OR_RETURN(auto nvme, NvmeTier::Create(extents.get(), {}));
  STRATA_ASSIGN_OR_RETURN(auto device, EmulatedDevice::Create({.capacity_bytes = device_bytes}));
  STRATA_ASSIGN_OR_RETURN(auto device_tier,
                          DeviceTier::Create(device.get(), {.capacity_bytes = device_bytes}));
  STRATA_ASSIGN_OR_RETURN(auto executor, ThreadPoolExecutor::Create(options.io_threads));
  RealClock clock;

  std::vector<ShardKey> sequence;
  for (const TraceAccess& a : trace.accesses) sequence.push_back(a.key);
  std::optional<LearnedPredictor> learned;
  std::optional<OracleAccessPredictor> oracle;
  const AccessPredictor* predictor = nullptr;
  if (policy == SimPolicy::kPredictor) predictor = &learned.emplace();
  if (policy == SimPolicy::kBelady) predictor = &oracle.emplace(sequence);
  std::unique_ptr<PredictionTrust> trust;
  if (learned.has_value() && config.prediction_trust) {
    STRATA_ASSIGN_OR_RETURN(trust,
                            PredictionTrust::Create({.capacity_shards = slots,
                                                     .half_life_accesses = config.trust_half_life,
                                                     .hysteresis_misses = config.trust_hysteresis}));
  }
  std::optional<FarthestNextUsePolicy> farthest;
  if (predictor != nullptr) farthest.emplace(predictor, trust.get());
  TieredStoreOptions so;
  so.clock = &clock;
  so.executor = executor.get();
  so.policy = farthest.has_value() ? &*farthest : nullptr;
  STRATA_ASSIGN_OR_RETURN(auto store, TieredStore::Create({device_tier.get(), nvme.get()}, so));
  {
    std::vector<std::byte> data(shard);
    for (size_t i = 0; i < trace.shards.size(); ++i) {
      std::fill(data.begin(), data.end(), static_cast<std::byte>(i));
      STRATA_RETURN_IF_ERROR(store->AddShard(trace.shards[i], TierKind::kNvme, data));
    }
  }
  std::optional<PrefetchScheduler> scheduler;
  if (predictor != nullptr) {
    scheduler.emplace(store.get(), predictor,
                      PrefetchSchedulerOptions{.tier = TierKind::kDevice,
                                               .lookahead_count = config.lookahead_count,
                                               .lookahead_bytes = config.lookahead_count * shard,
                                               .max_in_flight = config.max_in_flight,
                                               .urgent_distance = config.urgent_distance,
                                               .adaptive_urgency = config.adaptive_urgency,
                                               .write_backs_per_pump = config.write_backs_per_pump,
                                               .trust = trust.get()});
  }
  const double compute = options.compute_us * 1e-6;
  RealResult result;
  const StoreStats before = store->stats();
  const auto start = std::chrono::steady_clock::now();
  size_t iteration = 0;
  for (size_t i = 0; i < trace.accesses.size(); ++i) {
    if (iteration + 1 < trace.iteration_starts.size() && trace.iteration_starts[iteration + 1] == i) {
      ++iteration;
      if (learned.has_value()) learned->MarkIterationBoundary();
    }
    const TraceAccess& a = trace.accesses[i];
    if (trust != nullptr) trust->OnAccess(a.key, *predictor);
    STRATA_ASSIGN_OR_RETURN(Lease lease,
                            store->Acquire(a.key, TierKind::kDevice,
                                           a.write ? AccessMode::kWrite : AccessMode::kRead));
    if (learned.has_value()) learned->OnAccess(a.key);
    if (oracle.has_value()) oracle->Advance();
    if (scheduler.has_value()) scheduler->Pump();
    Compute(compute);
    result.compute_seconds += compute;
    STRATA_RETURN_IF_ERROR(store->Release(lease.id, a.write));
    if (scheduler.has_value()) scheduler->Pump();
  }
  result.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const StoreStats after = store->stats();
  result.accesses = trace.accesses.size();
  result.fetches = after.tier(TierKind::kDevice).promotions - before.tier(TierKind::kDevice).promotions;
  result.bytes_moved = (after.bytes_up + after.bytes_down) - (before.bytes_up + before.bytes_down);
  result.stall_seconds = absl::ToDoubleSeconds(after.stall_time - before.stall_time);
  result.prefetches_issued = after.prefetches_issued;
  result.prefetches_wasted = after.prefetches_wasted;
  STRATA_RETURN_IF_ERROR(store->CheckInvariants());
  return result;
}

}  // namespace

void AddRealBenchFlags(CommandLine& cl, RealBenchOptions* o) {
  cl.AddString("real_dir", &o->dir, "--real: directory for the NVMe extent store");
  cl.AddString("engine", &o->engine, "--real: io_uring, libaio or psync (default: first that works)");
  cl.AddParsed("real_shard_kib", [o](absl::string_view v) {
    return absl::SimpleAtoi(v, &o->shard_kib) && o->shard_kib >= 4
               ? absl::OkStatus()
               : absl::InvalidArgumentError("--real_shard_kib: a whole number >= 4");
  }, "--real: shard size in KiB (1024)");
  cl.AddParsed("real_compute_us", [o](absl::string_view v) {
    return absl::SimpleAtod(v, &o->compute_us) && o->compute_us >= 0
               ? absl::OkStatus()
               : absl::InvalidArgumentError("--real_compute_us: a number >= 0");
  }, "--real: emulated compute per access in microseconds (1000)");
  cl.AddParsed("real_iterations", [o](absl::string_view v) {
    return absl::SimpleAtoi(v, &o->iterations) && o->iterations > 0
               ? absl::OkStatus()
               : absl::InvalidArgumentError("--real_iterations: a whole number > 0");
  }, "--real: iterations per trace (4)");
  cl.AddParsed("io_threads", [o](absl::string_view v) {
    return absl::SimpleAtoi(v, &o->io_threads) && o->io_threads > 0
               ? absl::OkStatus()
               : absl::InvalidArgumentError("--io_threads: a whole number > 0");
  }, "--real: transfer threads (2)");
}

int RunRealPrefetchBench(const std::vector<std::string>& traces,
                         const std::vector<double>& capacities, const TraceOptions& trace_options,
                         const SimConfig& base_config, const RealBenchOptions& options,
                         const std::string& json_path) {
  std::optional<IoEngineKind> forced;
  if (!options.engine.empty()) {
    auto kind = ParseIoEngineKind(options.engine);
    if (!kind.ok()) {
      std::fprintf(stderr, "--engine: %s\n", std::string(kind.status().message()).c_str());
      return 2;
    }
    forced = *kind;
  }
  std::vector<std::string> notes;
  auto engine = OpenIoEngine(IoEngineOptions{}, forced, &notes);
  if (!engine.ok()) {
    std::fprintf(stderr, "opening an I/O engine: %s\n", std::string(engine.status().message()).c_str());
    return 1;
  }
  ::mkdir(options.dir.c_str(), 0700);
  std::printf("strata bench prefetch --real: engine %s, extent store in %s, shard %u KiB, compute "
              "%.0f us per access, %u iterations, %u transfer threads\n",
              (*engine)->info().name.c_str(), options.dir.c_str(), options.shard_kib,
              options.compute_us, options.iterations, options.io_threads);
  for (const std::string& n : notes) std::printf("  note: %s\n", n.c_str());
  std::printf("%-12s %5s %-9s %6s %9s %10s %9s\n", "trace", "cap", "policy", "hit", "MiB_moved",
              "stall", "wall/ideal");
  nlohmann::json results = nlohmann::json::array();
  for (const std::string& name : traces) {
    TraceOptions topts = trace_options;
    topts.iterations = options.iterations;
    auto trace = GenerateTrace(name, topts);
    if (!trace.ok()) {
      std::fprintf(stderr, "%s\n", std::string(trace.status().message()).c_str());
      return 2;
    }
    for (double cap : capacities) {
      SimConfig config = base_config;
      config.capacity_fraction = cap;
      for (SimPolicy policy : {SimPolicy::kLru, SimPolicy::kPredictor, SimPolicy::kBelady}) {
        auto r = RunOne(*trace, policy, config, options, engine->get(), options.dir);
        if (!r.ok()) {
          std::fprintf(stderr, "%s at %.2f (%s): %s\n", name.c_str(), cap,
                       std::string(SimPolicyName(policy)).c_str(),
                       std::string(r.status().message()).c_str());
          return 1;
        }
        const double hit = 1.0 - static_cast<double>(r->fetches) / r->accesses;
        const double stall = r->stall_seconds / r->compute_seconds;
        std::printf("%-12s %5.2f %-9s %6.4f %9.1f %9.2f%% %9.3f\n", name.c_str(), cap,
                    std::string(SimPolicyName(policy)).c_str(), hit,
                    static_cast<double>(r->bytes_moved) / (1 << 20), 100 * stall,
                    r->wall_seconds / r->compute_seconds);
        std::fflush(stdout);  // rows arrive seconds apart: show progress
        results.push_back({{"trace", name},
                           {"capacity", cap},
                           {"policy", std::string(SimPolicyName(policy))},
                           {"hit_rate", hit},
                           {"bytes_moved", r->bytes_moved},
                           {"stall_fraction", stall},
                           {"wall_over_compute", r->wall_seconds / r->compute_seconds}});
      }
    }
  }
  if (!json_path.empty()) {
    nlohmann::json out;
    out["mode"] = "real";
    out["engine"] = (*engine)->info().name;
    out["results"] = results;
    std::ofstream file(json_path);
    file << out.dump(2) << "\n";
    if (!file) {
      std::fprintf(stderr, "writing %s failed\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace strata
