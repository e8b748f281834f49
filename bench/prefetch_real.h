// `strata bench prefetch --real`: the same replay as the simulation, but
// through the NVMe tier (swap's ExtentStore on the real I/O engine) as the
// home, an emulated device tier, a thread-pool executor and the wall clock.
// Each access spends an emulated compute time; the figure is the wall-clock
// time Acquire calls waited (the store's stall counter) over the no-offload
// time.
#ifndef STRATA_BENCH_PREFETCH_REAL_H_
#define STRATA_BENCH_PREFETCH_REAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "bench/prefetch_sim.h"
#include "bench/prefetch_traces.h"
#include "core/command_line.h"

namespace strata {

struct RealBenchOptions {
  std::string dir = "/var/tmp/strata-prefetch-bench";
  std::string engine;           // empty: io_uring -> libaio -> psync
  uint32_t shard_kib = 1024;    // real shard size
  double compute_us = 1000;     // emulated compute per access
  uint32_t iterations = 4;
  uint32_t io_threads = 2;
};

void AddRealBenchFlags(CommandLine& cl, RealBenchOptions* options);

// Runs every trace x capacity x policy; prints a table, writes `json_path`
// when non-empty. Returns the process exit status.
int RunRealPrefetchBench(const std::vector<std::string>& traces,
                         const std::vector<double>& capacities, const TraceOptions& trace_options,
                         const SimConfig& config, const RealBenchOptions& options,
                         const std::string& json_path);

}  // namespace strata

#endif  // STRATA_BENCH_PREFETCH_REAL_H_
