// The simulated prefetch benchmark: replays a generated trace through the
// real TieredStore, eviction policies, predictors and prefetch scheduler, on
// a single thread (InlineExecutor) with a simulated clock and a cost model,
// so every figure is exact and repeatable.
//
// Model. The store has a device tier of `capacity_fraction` of the trace's
// working set and a home tier holding everything. Each access acquires its
// shard in the device tier, computes for `compute_per_access`, and releases
// it (dirty if the access writes). Data moves over one link (the NVMe
// device): a promotion takes shard_bytes / read_bandwidth, a write-back
// shard_bytes / write_bandwidth, one transfer at a time in issue order.
// Prefetches are issued right after an access starts, so they overlap its
// compute, and again when it ends (for room its own shard was holding); an
// access waits (stalls) until its shard has arrived. The store
// moves small real buffers; the cost model charges `shard_bytes` per shard.
#ifndef STRATA_BENCH_PREFETCH_SIM_H_
#define STRATA_BENCH_PREFETCH_SIM_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "bench/prefetch_traces.h"

namespace strata {

enum class SimPolicy { kLru, kPredictor, kBelady };
absl::string_view SimPolicyName(SimPolicy policy);  // "lru", "predictor", "belady"

struct SimConfig {
  double capacity_fraction = 0.5;
  uint64_t shard_bytes = 64ull << 20;
  double read_bytes_per_second = 6.4e9;
  double write_bytes_per_second = 3.2e9;
  absl::Duration compute_per_access = absl::Milliseconds(20);
  // Prefetch window (predictor and belady): shards and bytes ahead, and
  // promotions in flight.
  size_t lookahead_count = 8;
  uint64_t lookahead_bytes = 8 * (64ull << 20);
  size_t max_in_flight = 8;
  size_t urgent_distance = std::numeric_limits<size_t>::max();  // see PrefetchSchedulerOptions
  bool adaptive_urgency = true;  // see PrefetchSchedulerOptions
  // The predictor row follows its prediction only while a PredictionTrust
  // (shadow caches of the tier's size) measures it beating recency.
  bool prediction_trust = true;
  double trust_half_life = 512;  // accesses (PredictionTrustOptions)
  double trust_hysteresis = 1.0;  // misses (PredictionTrustOptions)
  size_t write_backs_per_pump = 1;
  // Whether the client marks iteration boundaries (else they are detected
  // after the first iteration, which is always marked).
  bool mark_boundaries = true;
};

struct SimResult {
  uint64_t accesses = 0;
  uint64_t fetches = 0;         // promotions into the device tier
  uint64_t ready_accesses = 0;  // accesses that did not wait at all
  uint64_t bytes_moved = 0;     // modelled bytes, both directions
  double stall_seconds = 0;
  double compute_seconds = 0;   // the no-offload time
  double link_busy_seconds = 0;
  uint64_t prefetches_issued = 0;
  uint64_t prefetches_used = 0;
  uint64_t prefetches_wasted = 0;
  uint64_t relearns = 0;
  uint64_t trust_switches = 0;
  uint64_t untrusted_accesses = 0;
  std::vector<uint64_t> fetches_per_iteration;
  std::vector<double> stall_per_iteration;  // seconds
  std::vector<double> compute_per_iteration;
  size_t capacity_shards = 0;

  double hit_rate() const;
  double ready_rate() const;
  double stall_fraction() const { return compute_seconds == 0 ? 0 : stall_seconds / compute_seconds; }
  // The same from iteration `first` on (steady state: after the iteration in
  // which the predictor learns).
  double hit_rate_from(const GeneratedTrace& trace, size_t first) const;
  double stall_fraction_from(size_t first) const;
};

// Hit rate of `fetches_per_iteration` over iterations [first, end).
double HitRateFrom(const GeneratedTrace& trace, const std::vector<uint64_t>& fetches_per_iteration,
                   size_t first);

absl::StatusOr<SimResult> RunSimulation(const GeneratedTrace& trace, SimPolicy policy,
                                        const SimConfig& config);

// Slots of the device tier for `fraction` of the trace's working set (>= 1).
size_t CapacityShards(const GeneratedTrace& trace, double fraction);

}  // namespace strata

#endif  // STRATA_BENCH_PREFETCH_SIM_H_
