// `strata bench offload`: the daemon's optimizer step for N parameters
// (ZeRO-Offload: states in pinned host memory; ZeRO-Infinity: states on
// NVMe), timed from the trainer's side, against its parts measured alone in
// the same run (bench/offload_parts.h): the CPU optimizer on the same data,
// and the step's NVMe reads and writes. Overlap efficiency is
// max(parts) / step time: 1.0 means the daemon hides everything behind its
// slowest part. Starts its own stratad unless --socket names one.
#ifndef STRATA_BENCH_OFFLOAD_BENCH_H_
#define STRATA_BENCH_OFFLOAD_BENCH_H_

namespace strata {

// argv[0] is "offload". Returns 0 on success, 1 when a measurement failed, 2
// on bad usage (one line on stderr naming the flag).
int RunOffloadBench(int argc, char** argv);

}  // namespace strata

#endif  // STRATA_BENCH_OFFLOAD_BENCH_H_
