// DeepSpeed's aio_handle (what ZeRO-Infinity swaps through) as an in-run peer
// of `strata bench io`: bench/ds_io_peer.py kept running beside the bench,
// asked for one timed run at a time so that runs alternate with ours on the
// same file, block size and queue depth.
#ifndef STRATA_BENCH_IO_DS_IO_H_
#define STRATA_BENCH_IO_DS_IO_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/peer_process.h"
#include "swap/io_engine.h"

namespace strata {

class DsIoPeer {
 public:
  // Starts the peer under `python` (the venv's, with DeepSpeed) on `file`,
  // moving `io_size` bytes per aio_handle call, and waits until DeepSpeed's
  // async_io op has loaded -- the first time it is JIT-built, which takes
  // minutes. Unavailable, with the peer's reason, when it cannot load.
  static absl::StatusOr<std::unique_ptr<DsIoPeer>> Start(const std::string& python, const std::string& file,
                                                         uint64_t io_size);
  // MB/s (10^6 bytes/s) of back-to-back pread/pwrite + wait for `runtime`.
  absl::StatusOr<double> Measure(IoOp op, uint64_t block_size, uint32_t queue_depth, absl::Duration runtime);
  const std::string& version() const { return version_; }

 private:
  std::unique_ptr<PeerCoprocess> proc_;
  std::string version_;
};

}  // namespace strata

#endif  // STRATA_BENCH_IO_DS_IO_H_
