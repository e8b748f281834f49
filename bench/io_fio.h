// Running fio, the peer `strata bench io` measures against, with the same
// engine, block size, queue depth, direct I/O and file as our own run.
//
// Options map one to one: our io_uring with registered buffers and files is
// fio's io_uring with --fixedbufs --registerfiles (and --sqthread_poll with
// SQPOLL); libaio is libaio; our psync engine keeps `depth` pread/pwrite calls
// running on `depth` threads, which in fio is psync with numjobs=depth, each
// job streaming its own 1/depth of the file (fio's psync ignores iodepth).
#ifndef STRATA_BENCH_IO_FIO_H_
#define STRATA_BENCH_IO_FIO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "swap/io_engine.h"

namespace strata {

struct FioJob {
  IoEngineKind engine = IoEngineKind::kUring;
  IoOp op = IoOp::kRead;  // sequential read or write
  std::string filename;
  uint64_t file_size_bytes = 0;
  uint64_t block_size_bytes = 1 << 20;
  uint32_t queue_depth = 1;
  bool fixed_buffers_and_files = false;  // io_uring only
  bool sqpoll = false;                   // io_uring only
  absl::Duration runtime = absl::Seconds(2);
  // Passed as --iomem when set, e.g. "mmaphuge:/dev/hugepages/strata-fio" to
  // give fio huge-page buffers like ours (needs hugetlbfs pages reserved).
  std::string iomem;
  // Runs fio with GLIBC_TUNABLES=glibc.malloc.hugetlb=1: glibc then
  // madvise(MADV_HUGEPAGE)s the mmap'd chunks fio's --iomem=malloc buffers
  // come from, so fio's buffers sit on 2 MiB transparent huge pages like
  // ours -- without reserving hugetlbfs pages, which mmaphuge/shmhuge need
  // (nr_hugepages is 0 on these machines) and which change the host.
  bool thp_malloc = false;
  std::string output_path;  // fio's JSON report
};

// The argv (without "fio" itself) for `job`.
std::vector<std::string> FioArguments(const FioJob& job);

// Bytes per second from fio's --output-format=json report (summed over jobs).
absl::StatusOr<double> ParseFioBandwidth(absl::string_view json, IoOp op);

// "fio-3.33", or NotFound when fio is not on PATH (the bench then runs
// without the peer and says so).
absl::StatusOr<std::string> FioVersion();

// Runs fio for `job` and returns MB/s (10^6 bytes per second, as fio prints).
absl::StatusOr<double> RunFio(const FioJob& job);

}  // namespace strata

#endif  // STRATA_BENCH_IO_FIO_H_
