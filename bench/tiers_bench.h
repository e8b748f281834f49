// `strata bench tiers`: bandwidth between the memory tiers the daemon moves
// shards through, each against its peer in the same run:
//   pinned <-> device   the Device seam (CudaDevice on a GPU, EmulatedDevice
//                       without) vs cudaMemcpyAsync from cudaHostAlloc memory on
//                       a GPU, or memcpy between two host buffers when emulated;
//   pinned <-> NVMe     ExtentStore (checksummed, the daemon's swap path) vs the
//                       raw io engine moving the same bytes;
//   device <-> NVMe     through two pinned staging chunks, the NVMe read of
//                       chunk k+1 overlapping the device copy of chunk k, vs the
//                       slower of the two links alone (what perfect overlap gives).
#ifndef STRATA_BENCH_TIERS_BENCH_H_
#define STRATA_BENCH_TIERS_BENCH_H_

namespace strata {

int RunTiersBench(int argc, char** argv);

}  // namespace strata

#endif  // STRATA_BENCH_TIERS_BENCH_H_
