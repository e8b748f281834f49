// Order statistics of benchmark samples: medians of repeated runs (this
// machine is shared and noisy, so benchmarks report medians, not means) and
// latency percentiles.
#ifndef STRATA_BENCH_SAMPLE_STATS_H_
#define STRATA_BENCH_SAMPLE_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

// The p-th percentile (0 <= p <= 100) by the nearest-rank method: the
// smallest sample with at least p% of the samples at or below it. 0 for no
// samples. Takes a copy because it sorts.
double Percentile(std::vector<double> samples, double p);

// The middle sample (mean of the two middle ones for an even count); 0 for none.
double Median(std::vector<double> samples);

// "1.23 2.34 3.45": every sample with `decimals` digits, for the raw runs
// column that lets a reader judge the spread.
std::string JoinSamples(const std::vector<double>& samples, int decimals);

// Monotonic nanoseconds (CLOCK_MONOTONIC), comparable across processes of
// this machine.
int64_t MonotonicNanos();

// The 1-, 5- and 15-minute load averages ("6.29 9.86 11.52", from
// /proc/loadavg; "" when unreadable), printed beside timings so a reader can
// tell a contended run from a slow one.
std::string LoadAverageText();

}  // namespace strata

#endif  // STRATA_BENCH_SAMPLE_STATS_H_
