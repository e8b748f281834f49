// Belady's MIN computed offline on an actual trace: the fewest fetches any
// cache of `capacity` equal-sized slots can do (each access needs its shard
// in the cache; on a miss the cached shard used farthest in the future goes).
// This is the limit the prefetch benchmark measures hit rates against.
#ifndef STRATA_BENCH_BELADY_MIN_H_
#define STRATA_BENCH_BELADY_MIN_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "bench/prefetch_traces.h"

namespace strata {

struct MinResult {
  uint64_t accesses = 0;
  uint64_t fetches = 0;      // misses, compulsory ones included
  uint64_t write_backs = 0;  // evictions of shards written since they were fetched
  std::vector<uint64_t> fetches_per_iteration;
  double hit_rate() const {
    return accesses == 0 ? 0 : 1.0 - static_cast<double>(fetches) / static_cast<double>(accesses);
  }
};

// REQUIRES: capacity >= 1.
MinResult ComputeBeladyMin(const GeneratedTrace& trace, size_t capacity);

}  // namespace strata

#endif  // STRATA_BENCH_BELADY_MIN_H_
