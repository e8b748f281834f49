// `strata bench io`: NVMe throughput of our io engines against fio in the
// same run, the swap path through ExtentStore against the raw engine, and a
// block-size x queue-depth sweep (--tune) that prints the best setting as a
// config snippet, as DeepSpeed's ds_nvme_tune does. See docs/SWAP.md.
#ifndef STRATA_BENCH_IO_BENCH_H_
#define STRATA_BENCH_IO_BENCH_H_

namespace strata {

// argv[0] is "io". Returns 0 on success, 1 when a measurement failed, 2 on bad
// usage (one line on stderr naming the flag).
int RunIoBench(int argc, char** argv);

}  // namespace strata

#endif  // STRATA_BENCH_IO_BENCH_H_
