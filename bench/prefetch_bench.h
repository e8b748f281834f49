// `strata bench prefetch`: replays generated training traces through the
// tiered store under LRU, the learned predictor and Belady's MIN (the offline
// limit), and reports hit rate, bytes moved and stall time over the
// no-offload time. See docs/PREFETCH.md for the model and the targets.
#ifndef STRATA_BENCH_PREFETCH_BENCH_H_
#define STRATA_BENCH_PREFETCH_BENCH_H_

namespace strata {

// argv[0] is "prefetch". Returns 0 on success (targets missed still return 0:
// the table says so), 1 on a runtime failure, 2 on bad usage.
int RunPrefetchBench(int argc, char** argv);

}  // namespace strata

#endif  // STRATA_BENCH_PREFETCH_BENCH_H_
