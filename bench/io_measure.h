// The measurements `strata bench io` makes with our own code: sequential
// O_DIRECT throughput of one engine at one block size and queue depth (the
// same access pattern fio runs), and the swap path -- shards written and read
// through ExtentStore with checksums -- against the raw engine moving the same
// bytes.
#ifndef STRATA_BENCH_IO_MEASURE_H_
#define STRATA_BENCH_IO_MEASURE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "swap/aligned_buffer.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"

namespace strata {

struct EngineRun {
  IoEngineKind engine = IoEngineKind::kUring;
  IoOp op = IoOp::kRead;
  uint64_t block_size_bytes = 1 << 20;
  uint32_t queue_depth = 1;
  bool register_buffers_and_files = true;
  bool sqpoll = false;
  absl::Duration runtime = absl::Seconds(2);
};

// Streams `run.op` sequentially over the first `file_size_bytes` of `fd`
// (opened O_DIRECT; wraps around), keeping queue_depth block-size requests in
// flight for `runtime`, using `buffers` (at least depth x block size,
// pre-faulted). Returns MB/s (10^6 bytes/s) over the time from the first
// submission to the last completion. Any I/O error fails the run.
absl::StatusOr<double> MeasureEngine(const EngineRun& run, int fd, const std::string& path,
                                     uint64_t file_size_bytes, const AlignedBuffer& buffers);

// Writes the first `bytes` of `fd` sequentially (so later runs do not pay for
// allocating or converting unwritten extents).
absl::Status FillFile(int fd, const std::string& path, uint64_t bytes);

struct SwapPathResult {
  double store_write_mbps = 0;
  double store_read_mbps = 0;
  double raw_write_mbps = 0;
  double raw_read_mbps = 0;
};

struct SwapPathRun {
  std::string dir;
  IoEngineKind engine = IoEngineKind::kUring;
  uint64_t block_size_bytes = 1 << 20;
  uint32_t queue_depth = 32;
  uint64_t shard_bytes = 64 << 20;
  uint32_t shards = 8;
  ChecksumKind checksum = ChecksumKind::kXxh3;
  SyncPolicy sync_policy = SyncPolicy::kNever;
};

// Opens a store under `run.dir`/strata-bench-store and a raw file beside it
// once; each call to Round() writes then reads every shard through both, in
// the order given, and returns the four rates.
class SwapPathBench {
 public:
  static absl::StatusOr<std::unique_ptr<SwapPathBench>> Create(const SwapPathRun& run);
  ~SwapPathBench();
  absl::StatusOr<SwapPathResult> Round(bool store_first);

 private:
  SwapPathBench() = default;
  absl::StatusOr<double> RawPass(IoOp op);
  absl::StatusOr<double> StorePass(IoOp op);

  SwapPathRun run_;
  std::unique_ptr<IoEngine> store_engine_;
  std::unique_ptr<IoEngine> raw_engine_;
  std::unique_ptr<ExtentStore> store_;
  int raw_fd_ = -1;
  std::string raw_path_;
  std::string store_dir_;
  IoFileId raw_file_;
  AlignedBuffer src_;
  AlignedBuffer dst_;
};

}  // namespace strata

#endif  // STRATA_BENCH_IO_MEASURE_H_
