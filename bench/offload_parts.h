// The parts of one daemon optimizer step, each measured alone in the
// benchmark process, so `strata bench offload` can set the daemon's step
// time against them:
//
//   OptimizerPart  CpuOptimizer::Step over the same elements, cut into the
//                  same pieces (the daemon's shards, and its NVMe staging
//                  tiles in infinity mode), with the same thread count, the
//                  same dtypes (fp16 gradients in, fp16 params out) and the
//                  same hyperparameters, on pre-touched buffers.
//   NvmeIoPart     The NVMe traffic of a ZeRO-Infinity step, done one request
//                  after another: per staging tile, read then write the fp32
//                  master, exp_avg and exp_avg_sq; per shard, write the fp16
//                  params; then the job record and a Commit. It goes through
//                  swap/'s ExtentStore over an engine opened as the daemon
//                  opens its own (same engine choice, queue depth and block
//                  size), from page-locked staging like the daemon's, into a
//                  store of its own in a directory on the same file system.
//
// Thread-compatible.
#ifndef STRATA_BENCH_OFFLOAD_PARTS_H_
#define STRATA_BENCH_OFFLOAD_PARTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"
#include "tiers/pinned_arena.h"

namespace strata {

// How the daemon lays out one rank's step.
struct StepShape {
  std::vector<uint64_t> shard_elements;  // padded elements of each shard, in index order
  // Elements per NVMe staging tile (infinity), which is also the largest
  // span one CpuOptimizer::Step call covers there; 0 = whole shards (offload).
  uint64_t tile_elements = 0;
  uint64_t total_elements() const;
  // The (shard, offset, size) pieces one step visits, in order.
  struct Piece {
    uint32_t shard = 0;
    uint32_t tile = 0;
    uint64_t offset = 0;
    uint64_t size = 0;
  };
  std::vector<Piece> Pieces() const;
};

class OptimizerPart {
 public:
  // Allocates and touches fp32 master/exp_avg/exp_avg_sq, fp16 gradients and
  // fp16 param outputs for every element (16 bytes per element).
  static absl::StatusOr<std::unique_ptr<OptimizerPart>> Create(const StepShape& shape, int threads,
                                                               const OptimizerHyperparams& hyperparams,
                                                               float grad_scale);
  // One optimizer step over every piece; returns seconds.
  absl::StatusOr<double> Step();
  // The daemon's gradient inspection (inf/nan check and squared norm) over
  // every shard; returns seconds.
  absl::StatusOr<double> Inspect();

 private:
  OptimizerPart(StepShape shape, std::unique_ptr<CpuOptimizer> optimizer, OptimizerHyperparams hp,
                float grad_scale);

  const StepShape shape_;
  std::unique_ptr<CpuOptimizer> optimizer_;
  const OptimizerHyperparams hp_;
  const float grad_scale_;
  int64_t step_ = 0;
  std::unique_ptr<float[]> master_, exp_avg_, exp_avg_sq_;
  std::unique_ptr<uint16_t[]> grad_, param_out_;
};

struct NvmeIoPartOptions {
  std::string dir;  // exists; gets the store's data file and journal
  uint64_t capacity_bytes = 0;
  SyncPolicy sync_policy = SyncPolicy::kEveryCommit;
  uint32_t queue_depth = 8;                 // stratad's default io_queue_depth
  uint64_t block_size_bytes = 1ull << 20;   // stratad's default io_block_size
  uint64_t record_bytes = 4096;             // the job record written with each step
};

class NvmeIoPart {
 public:
  // Opens the engine and the store, writes the initial states and params (as
  // job registration does) and commits, then runs two untimed steps (as
  // InitParams and the warm-up step do for the daemon's store).
  static absl::StatusOr<std::unique_ptr<NvmeIoPart>> Create(const StepShape& shape,
                                                            const NvmeIoPartOptions& options);
  ~NvmeIoPart();

  // One step's reads and writes, sequentially; returns seconds.
  absl::StatusOr<double> Step();

  uint64_t bytes_read_per_step() const;
  uint64_t bytes_written_per_step() const;
  // "io_uring (depth 8, block 1.0 MiB), O_DIRECT" and the like.
  std::string Describe() const;

 private:
  NvmeIoPart(StepShape shape, NvmeIoPartOptions options) : shape_(std::move(shape)), options_(std::move(options)) {}
  absl::Status WriteAll(bool states);

  const StepShape shape_;
  const NvmeIoPartOptions options_;
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<ExtentStore> store_;
  PinnedArena staging_;  // 3 streams x one tile, then the largest param slot
  uint64_t param_slot_bytes_ = 0;
  std::vector<std::string> notes_;
};

}  // namespace strata

#endif  // STRATA_BENCH_OFFLOAD_PARTS_H_
