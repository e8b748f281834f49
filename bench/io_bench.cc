#include "bench/io_bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/io_ds_io.h"
#include "bench/io_fio.h"
#include "bench/io_measure.h"
#include "bench/peer_process.h"
#include "core/byte_size.h"
#include "core/command_line.h"
#include "core/deepspeed_config.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "swap/aligned_buffer.h"
#include "swap/direct_io.h"
#include "swap/io_engine.h"

namespace strata {
namespace {

struct Flags {
  std::string dir;
  std::string deepspeed_config;
  uint64_t file_size = uint64_t{1} << 30;
  absl::Duration runtime = absl::Milliseconds(1500);
  bool runtime_given = false;
  uint32_t reps = 2;
  std::vector<IoEngineKind> engines = {IoEngineKind::kUring, IoEngineKind::kAio, IoEngineKind::kPsync};
  bool engines_given = false;
  std::vector<uint64_t> block_sizes = {128 << 10, 1 << 20, 8 << 20};
  bool block_sizes_given = false;
  std::vector<uint32_t> depths = {1, 8, 32};
  bool depths_given = false;
  std::vector<IoOp> ops = {IoOp::kRead, IoOp::kWrite};
  bool fio = true;
  bool register_buffers = true;
  bool sqpoll = false;
  bool thp = true;
  std::string fio_iomem;
  bool fio_huge = true;
  bool ds_io = true;
  std::string python;
  bool make_venv = false;
  IoEngineKind ds_io_engine = IoEngineKind::kUring;
  bool tune = false;
  bool store = true;
  bool matrix = true;
  std::string json_path;
  uint64_t shard_size = 64 << 20;
  uint32_t shards = 8;
  uint32_t store_reps = 3;
  ChecksumKind checksum = ChecksumKind::kXxh3;
  SyncPolicy store_sync = SyncPolicy::kNever;
  IoEngineKind store_engine = IoEngineKind::kUring;
  uint64_t store_block_size = 1 << 20;
  uint32_t store_depth = 32;
};

template <typename T, typename F>
absl::Status ParseList(absl::string_view text, std::vector<T>* out, F parse_one) {
  out->clear();
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    STRATA_ASSIGN_OR_RETURN(T v, parse_one(item));
    out->push_back(v);
  }
  if (out->empty()) return absl::InvalidArgumentError("empty list");
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ParseU32(absl::string_view s, uint32_t min, uint32_t max) {
  uint32_t v = 0;
  if (!absl::SimpleAtoi(s, &v) || v < min || v > max) {
    return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not a whole number in ", min, "..", max));
  }
  return v;
}

// Block sizes as fio and DeepSpeed write them: a bare K/M/G suffix is binary
// ("128K" = 131072, "1M" = 1048576); anything else as ParseByteSize reads it.
absl::StatusOr<uint64_t> ParseBlockSize(absl::string_view text) {
  if (!text.empty()) {
    char last = text.back();
    int shift = last == 'k' || last == 'K' ? 10 : last == 'm' || last == 'M' ? 20 : last == 'g' || last == 'G' ? 30 : -1;
    uint64_t n = 0;
    if (shift >= 0 && absl::SimpleAtoi(text.substr(0, text.size() - 1), &n)) return n << shift;
  }
  return ParseByteSize(text);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string SizeLabel(uint64_t bytes) {
  if (bytes % (1 << 20) == 0) return absl::StrCat(bytes >> 20, "M");
  if (bytes % (1 << 10) == 0) return absl::StrCat(bytes >> 10, "K");
  return absl::StrCat(bytes);
}

std::string Runs(const std::vector<double>& v) {
  std::string s;
  for (double x : v) absl::StrAppend(&s, s.empty() ? "" : " ", absl::StrFormat("%.0f", x));
  return s;
}

struct Point {
  IoEngineKind engine;
  IoOp op;
  uint64_t block_size;
  uint32_t depth;
  std::vector<double> ours;
  std::vector<double> fio;
  std::vector<double> ratios;  // per pair
  std::vector<double> fio_huge;         // fio with its buffers on huge pages
  std::vector<double> fio_huge_ratios;  // per pair
  double mbps() const { return Median(ours); }
  double fio_mbps() const { return Median(fio); }
  double ratio() const { return Median(ratios); }
  double fio_huge_mbps() const { return Median(fio_huge); }
  double fio_huge_ratio() const { return Median(fio_huge_ratios); }
};

// Ours (one engine) against DeepSpeed's aio_handle at one op, block, depth.
struct DsIoPoint {
  IoEngineKind engine;
  IoOp op;
  uint64_t block_size;
  uint32_t depth;
  std::vector<double> ours;
  std::vector<double> ds_io;
  std::vector<double> ratios;  // per pair
};

class IoBench {
 public:
  explicit IoBench(Flags flags) : f_(std::move(flags)) {}
  ~IoBench() {
    if (fd_ >= 0) close(fd_);
    if (!file_.empty()) unlink(file_.c_str());
  }

  absl::Status Run();

 private:
  absl::Status Prepare();
  absl::Status MeasurePoint(Point* p, uint32_t reps, bool with_fio);
  absl::Status RunMatrix();
  absl::Status RunTune();
  absl::Status RunSwapPath();
  absl::Status RunDsIo();
  absl::StatusOr<double> MeasureOurs(IoEngineKind engine, IoOp op, uint64_t block_size, uint32_t depth);
  void PrintTargets();
  absl::Status WriteJson();

  Flags f_;
  std::string file_;
  int fd_ = -1;
  AlignedBuffer buffers_;
  bool have_fio_ = false;
  std::vector<Point> points_;
  std::vector<SwapPathResult> swap_rounds_;
  std::vector<DsIoPoint> ds_points_;
  std::string ds_io_version_;
  std::string ds_io_note_;  // why ds_io was not measured
  std::string notes_;
  double load_[3] = {0, 0, 0};
};

absl::Status IoBench::Prepare() {
  file_ = f_.dir + "/strata-bench-io.dat";
  STRATA_ASSIGN_OR_RETURN(OpenedFile f, OpenForIo(file_, /*create=*/true, /*direct=*/true,
                                                  /*allow_buffered_fallback=*/false));
  fd_ = f.fd;
  if (int rc = posix_fallocate(fd_, 0, static_cast<off_t>(f_.file_size)); rc != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("preallocating ", FormatBytes(f_.file_size), " at ",
                                                     file_, " failed; free space or pass a smaller --file_size"));
  }
  std::printf("preparing %s (%s, written once so no run pays for unwritten extents)\n", file_.c_str(),
              FormatBytes(f_.file_size).c_str());
  std::fflush(stdout);
  STRATA_RETURN_IF_ERROR(FillFile(fd_, file_, f_.file_size));
  uint64_t max_bs = *std::max_element(f_.block_sizes.begin(), f_.block_sizes.end());
  uint32_t max_depth = *std::max_element(f_.depths.begin(), f_.depths.end());
  // --nothp: memory exactly like fio's malloc'd buffers: default page policy,
  // untouched until the first registration or I/O faults it in. (Touching
  // 4 KiB pages ourselves first gives a physically scattered layout that
  // costs reads up to half their rate on virtio-blk; see docs/SWAP.md.)
  STRATA_ASSIGN_OR_RETURN(buffers_, AlignedBuffer::Allocate(max_bs * max_depth, 4096, f_.thp, /*prefault=*/f_.thp));
  if (f_.thp) {
    for (size_t i = 0; i < buffers_.size(); i += 4096) buffers_.data()[i] = std::byte(i >> 12);
  }
  // Other work on the machine skews the checksum side (CPU) more than the
  // raw side; say how busy it was.
  if (getloadavg(load_, 3) == 3) {
    std::printf("load average at start: %.2f %.2f %.2f on %ld CPUs\n", load_[0], load_[1], load_[2],
                sysconf(_SC_NPROCESSORS_ONLN));
  }
  if (f_.fio) {
    absl::StatusOr<std::string> v = FioVersion();
    have_fio_ = v.ok();
    std::printf("peer: %s\n", v.ok() ? v->c_str() : std::string(v.status().message()).c_str());
  }
  return absl::OkStatus();
}

absl::StatusOr<double> IoBench::MeasureOurs(IoEngineKind engine, IoOp op, uint64_t block_size, uint32_t depth) {
  EngineRun run;
  run.engine = engine;
  run.op = op;
  run.block_size_bytes = block_size;
  run.queue_depth = depth;
  run.register_buffers_and_files = f_.register_buffers;
  run.sqpoll = f_.sqpoll;
  run.runtime = f_.runtime;
  // --nothp: a fresh, untouched buffer per run, faulted in all at once
  // when the engine registers it -- exactly what fio's per-process
  // malloc gets.
  AlignedBuffer fresh;
  if (!f_.thp) {
    STRATA_ASSIGN_OR_RETURN(fresh, AlignedBuffer::Allocate(block_size * depth, 4096,
                                                           /*huge_pages=*/false, /*prefault=*/false));
  }
  absl::StatusOr<double> r = MeasureEngine(run, fd_, file_, f_.file_size, f_.thp ? buffers_ : fresh);
  if (!r.ok()) {
    return absl::Status(r.status().code(), absl::StrCat(IoEngineKindName(engine), " ", IoOpName(op), " bs ",
                                                        SizeLabel(block_size), " qd ", depth, ": ",
                                                        r.status().message()));
  }
  return *r;
}

absl::Status IoBench::MeasurePoint(Point* p, uint32_t reps, bool with_fio) {
  FioJob job;
  job.engine = p->engine;
  job.op = p->op;
  job.filename = file_;
  job.file_size_bytes = f_.file_size;
  job.block_size_bytes = p->block_size;
  job.queue_depth = p->depth;
  job.fixed_buffers_and_files = f_.register_buffers;
  job.sqpoll = f_.sqpoll;
  job.runtime = f_.runtime;
  job.iomem = f_.fio_iomem;
  job.output_path = f_.dir + "/strata-bench-fio.json";
  FioJob huge_job = job;
  huge_job.thp_malloc = true;
  const bool with_huge = with_fio && f_.fio_huge;
  for (uint32_t rep = 0; rep < reps; ++rep) {
    // Rotate which side goes first so drift on this noisy disk hits all.
    double ours = 0, peer = 0, huge = 0;
    for (int k = 0; k < 3; ++k) {
      const int side = (k + static_cast<int>(rep)) % 3;
      if (side == 0) {
        STRATA_ASSIGN_OR_RETURN(ours, MeasureOurs(p->engine, p->op, p->block_size, p->depth));
      } else if (side == 1 && with_fio) {
        absl::StatusOr<double> r = RunFio(job);
        if (!r.ok()) return r.status();
        peer = *r;
      } else if (side == 2 && with_huge) {
        absl::StatusOr<double> r = RunFio(huge_job);
        if (!r.ok()) return r.status();
        huge = *r;
      }
    }
    p->ours.push_back(ours);
    if (with_fio) {
      p->fio.push_back(peer);
      p->ratios.push_back(peer > 0 ? ours / peer : 0);
    }
    if (with_huge) {
      p->fio_huge.push_back(huge);
      p->fio_huge_ratios.push_back(huge > 0 ? ours / huge : 0);
    }
  }
  return absl::OkStatus();
}

absl::Status IoBench::RunMatrix() {
  bool with_fio = have_fio_;
  size_t total = f_.engines.size() * f_.block_sizes.size() * f_.depths.size() * f_.ops.size();
  std::printf("\nsequential O_DIRECT, %s file, %s per run, %u pairs per point (ours and fio alternating), "
              "registered buffers/files: %s, sqpoll: %s, our buffers on %s pages (fio: malloc, 4 KiB); %zu points\n",
              FormatBytes(f_.file_size).c_str(), absl::FormatDuration(f_.runtime).c_str(), f_.reps,
              f_.register_buffers ? "yes (fio: --fixedbufs --registerfiles)" : "no", f_.sqpoll ? "yes" : "no",
              f_.thp ? "2 MiB huge" : "default (malloc-like)", total);
  if (with_fio && f_.fio_huge) {
    std::printf("fio-huge: fio again with GLIBC_TUNABLES=glibc.malloc.hugetlb=1, its buffers on 2 MiB transparent "
                "huge pages like ours (engine against engine)\n");
  }
  std::printf("%-9s %-5s %4s %3s %9s %9s %7s %11s %9s %7s   %-24s %-24s\n", "engine", "op", "bs", "qd", "ours MB/s",
              "fio MB/s", "ratio", "ratio range", "fio-huge", "ratio", "ours runs", "fio runs");
  std::fflush(stdout);
  for (IoEngineKind engine : f_.engines) {
    for (IoOp op : f_.ops) {
      for (uint64_t bs : f_.block_sizes) {
        for (uint32_t qd : f_.depths) {
          Point p{engine, op, bs, qd, {}, {}, {}, {}, {}};
          STRATA_RETURN_IF_ERROR(MeasurePoint(&p, f_.reps, with_fio));
          double lo = p.ratios.empty() ? 0 : *std::min_element(p.ratios.begin(), p.ratios.end());
          double hi = p.ratios.empty() ? 0 : *std::max_element(p.ratios.begin(), p.ratios.end());
          const bool huge = !p.fio_huge.empty();
          std::printf("%-9s %-5s %4s %3u %9.0f %9s %7s %11s %9s %7s   %-24s %-24s\n",
                      std::string(IoEngineKindName(engine)).c_str(), std::string(IoOpName(op)).c_str(),
                      SizeLabel(bs).c_str(), qd, p.mbps(),
                      with_fio ? absl::StrFormat("%.0f", p.fio_mbps()).c_str() : "-",
                      with_fio ? absl::StrFormat("%.3f", p.ratio()).c_str() : "-",
                      with_fio ? absl::StrFormat("%.2f-%.2f", lo, hi).c_str() : "-",
                      huge ? absl::StrFormat("%.0f", p.fio_huge_mbps()).c_str() : "-",
                      huge ? absl::StrFormat("%.3f", p.fio_huge_ratio()).c_str() : "-", Runs(p.ours).c_str(),
                      Runs(p.fio).c_str());
          std::fflush(stdout);
          points_.push_back(std::move(p));
        }
      }
    }
  }
  return absl::OkStatus();
}

void IoBench::PrintTargets() {
  if (!have_fio_ || points_.empty()) return;
  std::printf("\ntargets (median of per-pair ratios):\n");
  // 1. io_uring at bs >= 1M and qd >= 8 reaches 0.95x fio's io_uring.
  int checked = 0, met = 0;
  double worst = 1e9;
  std::string worst_at;
  for (const Point& p : points_) {
    if (p.engine != IoEngineKind::kUring || p.block_size < (1 << 20) || p.depth < 8) continue;
    ++checked;
    if (p.ratio() >= 0.95) ++met;
    if (p.ratio() < worst) {
      worst = p.ratio();
      worst_at = absl::StrCat(IoOpName(p.op), " ", SizeLabel(p.block_size), " qd ", p.depth);
    }
  }
  if (checked > 0) {
    std::printf("  io_uring vs fio io_uring, bs>=1M qd>=8: %d/%d points >= 0.95x (worst %.3f at %s) -> %s\n", met,
                checked, worst, worst_at.c_str(), met == checked ? "MET" : "MISSED");
  }
  // The same against fio with huge-page buffers: engine against engine.
  checked = met = 0;
  worst = 1e9;
  for (const Point& p : points_) {
    if (p.fio_huge.empty() || p.engine != IoEngineKind::kUring || p.block_size < (1 << 20) || p.depth < 8) continue;
    ++checked;
    if (p.fio_huge_ratio() >= 0.95) ++met;
    if (p.fio_huge_ratio() < worst) {
      worst = p.fio_huge_ratio();
      worst_at = absl::StrCat(IoOpName(p.op), " ", SizeLabel(p.block_size), " qd ", p.depth);
    }
  }
  if (checked > 0) {
    std::printf("  io_uring vs fio-huge io_uring, bs>=1M qd>=8: %d/%d points >= 0.95x (worst %.3f at %s) -> %s\n",
                met, checked, worst, worst_at.c_str(), met == checked ? "MET" : "MISSED");
  }
  // 2. Our best engine vs fio's best engine at each block size (and op).
  for (IoOp op : f_.ops) {
    for (uint64_t bs : f_.block_sizes) {
      const Point* ours = nullptr;
      const Point* peer = nullptr;
      for (const Point& p : points_) {
        if (p.op != op || p.block_size != bs) continue;
        if (ours == nullptr || p.mbps() > ours->mbps()) ours = &p;
        if (peer == nullptr || p.fio_mbps() > peer->fio_mbps()) peer = &p;
      }
      if (ours == nullptr) continue;
      double r = ours->mbps() / peer->fio_mbps();
      std::printf("  best %-5s bs %4s: ours %.0f MB/s (%s qd %u) vs fio %.0f MB/s (%s qd %u) = %.3f -> %s\n",
                  std::string(IoOpName(op)).c_str(), SizeLabel(bs).c_str(), ours->mbps(),
                  std::string(IoEngineKindName(ours->engine)).c_str(), ours->depth, peer->fio_mbps(),
                  std::string(IoEngineKindName(peer->engine)).c_str(), peer->depth, r, r >= 0.95 ? "MET" : "MISSED");
    }
  }
}

absl::Status IoBench::RunDsIo() {
  std::printf("\nds_io: DeepSpeed's aio_handle (single_submit false, overlap_events true, intra_op_parallelism 1; "
              "one pread/pwrite of the whole %s file per call, then wait(), as DeepSpeed's ds_io times it) vs our "
              "%s, same file, block and depth, %u pairs per point alternating\n",
              FormatBytes(f_.file_size).c_str(), std::string(IoEngineKindName(f_.ds_io_engine)).c_str(), f_.reps);
  if (!ds_io_note_.empty()) {
    std::printf("  not measured: %s\n", ds_io_note_.c_str());
    return absl::OkStatus();
  }
  std::string how;
  absl::StatusOr<std::string> python = FindVenvPython(f_.python, f_.make_venv, &how);
  if (!python.ok()) {
    ds_io_note_ = std::string(python.status().message());
    std::printf("  not measured: %s\n", ds_io_note_.c_str());
    return absl::OkStatus();
  }
  std::printf("  starting the peer with %s (%s); DeepSpeed JIT-builds its async_io op the first time (about 6 "
              "minutes on 2 cores, cached in ~/.cache/torch_extensions)\n", python->c_str(), how.c_str());
  std::fflush(stdout);
  absl::StatusOr<std::unique_ptr<DsIoPeer>> peer = DsIoPeer::Start(*python, file_, f_.file_size);
  if (!peer.ok()) {
    ds_io_note_ = std::string(peer.status().message());
    std::printf("  not measured: %s\n", ds_io_note_.c_str());
    return absl::OkStatus();
  }
  ds_io_version_ = (*peer)->version();
  std::printf("  peer: %s\n", ds_io_version_.c_str());
  std::printf("  %-5s %4s %3s %9s %11s %7s   %-20s %-20s\n", "op", "bs", "qd", "ours MB/s", "ds_io MB/s", "ratio",
              "ours runs", "ds_io runs");
  std::fflush(stdout);
  for (IoOp op : f_.ops) {
    for (uint64_t bs : f_.block_sizes) {
      for (uint32_t qd : f_.depths) {
        DsIoPoint d{f_.ds_io_engine, op, bs, qd, {}, {}, {}};
        for (uint32_t rep = 0; rep < f_.reps; ++rep) {
          double ours = 0, ds = 0;
          for (int side = 0; side < 2; ++side) {
            if ((side + rep) % 2 == 0) {
              STRATA_ASSIGN_OR_RETURN(ours, MeasureOurs(f_.ds_io_engine, op, bs, qd));
            } else {
              STRATA_ASSIGN_OR_RETURN(ds, (*peer)->Measure(op, bs, qd, f_.runtime));
            }
          }
          d.ours.push_back(ours);
          d.ds_io.push_back(ds);
          d.ratios.push_back(ds > 0 ? ours / ds : 0);
        }
        std::printf("  %-5s %4s %3u %9.0f %11.0f %7.3f   %-20s %-20s\n", std::string(IoOpName(op)).c_str(),
                    SizeLabel(bs).c_str(), qd, Median(d.ours), Median(d.ds_io), Median(d.ratios),
                    Runs(d.ours).c_str(), Runs(d.ds_io).c_str());
        std::fflush(stdout);
        ds_points_.push_back(std::move(d));
      }
    }
  }
  // Target (issue 12.3): >= 1.05x ds_io for reads and writes at >= 1M blocks.
  for (IoOp op : f_.ops) {
    int checked = 0, met = 0;
    double worst = 1e9;
    std::string worst_at;
    for (const DsIoPoint& d : ds_points_) {
      if (d.op != op || d.block_size < (1 << 20)) continue;
      ++checked;
      double r = Median(d.ratios);
      if (r >= 1.05) ++met;
      if (r < worst) {
        worst = r;
        worst_at = absl::StrCat(SizeLabel(d.block_size), " qd ", d.depth);
      }
    }
    if (checked > 0) {
      std::printf("  target %-5s >= 1.05x ds_io at bs >= 1M: %d/%d points (worst %.3f at %s) -> %s\n",
                  std::string(IoOpName(op)).c_str(), met, checked, worst, worst_at.c_str(),
                  met == checked ? "MET" : "MISSED");
    }
  }
  return absl::OkStatus();
}

absl::Status IoBench::RunTune() {
  std::printf("\n--tune: %s, sequential O_DIRECT, %s per point\n",
              std::string(IoEngineKindName(f_.engines[0])).c_str(), absl::FormatDuration(f_.runtime).c_str());
  std::printf("%-5s %4s %3s %9s\n", "op", "bs", "qd", "MB/s");
  struct Best {
    double score = 0;
    uint64_t bs = 0;
    uint32_t qd = 0;
    double read = 0, write = 0;
  } best;
  for (uint64_t bs : f_.block_sizes) {
    for (uint32_t qd : f_.depths) {
      double rates[2] = {0, 0};
      for (IoOp op : {IoOp::kRead, IoOp::kWrite}) {
        Point p{f_.engines[0], op, bs, qd, {}, {}, {}, {}, {}};
        STRATA_RETURN_IF_ERROR(MeasurePoint(&p, f_.reps, /*with_fio=*/false));
        rates[op == IoOp::kRead ? 0 : 1] = p.mbps();
        std::printf("%-5s %4s %3u %9.0f\n", std::string(IoOpName(op)).c_str(), SizeLabel(bs).c_str(), qd, p.mbps());
        std::fflush(stdout);
        points_.push_back(std::move(p));
      }
      // Swapping moves state both ways, so the harmonic mean of read and
      // write rates is what an optimizer step sees.
      double score = 2 / (1 / rates[0] + 1 / rates[1]);
      if (score > best.score) best = Best{score, bs, qd, rates[0], rates[1]};
    }
  }
  std::printf("\nbest: block size %s, queue depth %u: read %.0f MB/s, write %.0f MB/s\n", SizeLabel(best.bs).c_str(),
              best.qd, best.read, best.write);
  std::printf("\nDeepSpeed config (\"aio\" section):\n"
              "  \"aio\": {\"block_size\": %llu, \"queue_depth\": %u, \"intra_op_parallelism\": 1, "
              "\"single_submit\": false, \"overlap_events\": true}\n",
              static_cast<unsigned long long>(best.bs), best.qd);
  std::printf("\nstrata daemon config:\n  io_engine: \"%s\"\n  io_block_size: \"%s\"\n  io_queue_depth: %u\n",
              std::string(IoEngineKindName(f_.engines[0])).c_str(), FormatBytes(best.bs).c_str(), best.qd);
  return absl::OkStatus();
}

absl::Status IoBench::RunSwapPath() {
  SwapPathRun run;
  run.dir = f_.dir;
  run.engine = f_.store_engine;
  run.block_size_bytes = f_.store_block_size;
  run.queue_depth = f_.store_depth;
  run.shard_bytes = f_.shard_size;
  run.shards = f_.shards;
  run.checksum = f_.checksum;
  run.sync_policy = f_.store_sync;
  std::printf("\nswap path: %u shards of %s written (Write+Commit, fdatasync %s) then read through ExtentStore "
              "with %s checksums vs the raw engine (%s, bs %s, qd %u), %u rounds alternating\n",
              f_.shards, FormatBytes(f_.shard_size).c_str(), std::string(SyncPolicyName(f_.store_sync)).c_str(),
              std::string(ChecksumKindName(f_.checksum)).c_str(), std::string(IoEngineKindName(f_.store_engine)).c_str(),
              SizeLabel(f_.store_block_size).c_str(), f_.store_depth, f_.store_reps);
  std::fflush(stdout);
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<SwapPathBench> bench, SwapPathBench::Create(run));
  std::vector<double> w_ratio, r_ratio;
  for (uint32_t i = 0; i < f_.store_reps; ++i) {
    STRATA_ASSIGN_OR_RETURN(SwapPathResult r, bench->Round(/*store_first=*/i % 2 == 0));
    swap_rounds_.push_back(r);
  }
  std::vector<double> sw, sr, rw, rr;
  for (const SwapPathResult& r : swap_rounds_) {
    sw.push_back(r.store_write_mbps);
    sr.push_back(r.store_read_mbps);
    rw.push_back(r.raw_write_mbps);
    rr.push_back(r.raw_read_mbps);
    w_ratio.push_back(r.store_write_mbps / r.raw_write_mbps);
    r_ratio.push_back(r.store_read_mbps / r.raw_read_mbps);
  }
  std::printf("  %-6s %12s %12s %7s   %-20s %-20s\n", "op", "store MB/s", "raw MB/s", "ratio", "store runs", "raw runs");
  std::printf("  %-6s %12.0f %12.0f %7.3f   %-20s %-20s\n", "write", Median(sw), Median(rw), Median(w_ratio),
              Runs(sw).c_str(), Runs(rw).c_str());
  std::printf("  %-6s %12.0f %12.0f %7.3f   %-20s %-20s\n", "read", Median(sr), Median(rr), Median(r_ratio),
              Runs(sr).c_str(), Runs(rr).c_str());
  bool ok = Median(w_ratio) >= 0.97 && Median(r_ratio) >= 0.97;
  std::printf("  target ExtentStore with checksums >= 0.97x raw engine (issue 12.5), reads and writes -> %s\n",
              ok ? "MET" : "MISSED");
  return absl::OkStatus();
}

absl::Status IoBench::WriteJson() {
  if (f_.json_path.empty()) return absl::OkStatus();
  nlohmann::json j;
  j["results"] = nlohmann::json::array();
  for (const Point& p : points_) {
    nlohmann::json r;
    r["engine"] = std::string(IoEngineKindName(p.engine));
    r["op"] = std::string(IoOpName(p.op));
    r["block_size"] = p.block_size;
    r["queue_depth"] = p.depth;
    r["mbps"] = p.mbps();
    r["mbps_runs"] = p.ours;
    if (!p.fio.empty()) {
      r["fio_mbps"] = p.fio_mbps();
      r["fio_mbps_runs"] = p.fio;
      r["ratio"] = p.ratio();
      r["ratio_runs"] = p.ratios;
    } else {
      r["fio_mbps"] = nullptr;
      r["ratio"] = nullptr;
    }
    if (!p.fio_huge.empty()) {
      r["fio_huge_mbps"] = p.fio_huge_mbps();
      r["fio_huge_mbps_runs"] = p.fio_huge;
      r["ratio_vs_fio_huge"] = p.fio_huge_ratio();
    }
    j["results"].push_back(r);
  }
  j["ds_io"] = nlohmann::json::array();
  for (const DsIoPoint& d : ds_points_) {
    j["ds_io"].push_back({{"op", std::string(IoOpName(d.op))},
                          {"block_size", d.block_size},
                          {"queue_depth", d.depth},
                          {"ours_engine", std::string(IoEngineKindName(d.engine))},
                          {"ours_mbps", Median(d.ours)},
                          {"ds_io_mbps", Median(d.ds_io)},
                          {"ratio", Median(d.ratios)},
                          {"ours_mbps_runs", d.ours},
                          {"ds_io_mbps_runs", d.ds_io},
                          {"ratio_runs", d.ratios}});
  }
  j["ds_io_peer"] = ds_io_version_;
  if (!ds_io_note_.empty()) j["ds_io_not_measured"] = ds_io_note_;
  if (!swap_rounds_.empty()) {
    std::vector<double> sw, sr, rw, rr, wr, rrat;
    for (const SwapPathResult& r : swap_rounds_) {
      sw.push_back(r.store_write_mbps);
      sr.push_back(r.store_read_mbps);
      rw.push_back(r.raw_write_mbps);
      rr.push_back(r.raw_read_mbps);
      wr.push_back(r.store_write_mbps / r.raw_write_mbps);
      rrat.push_back(r.store_read_mbps / r.raw_read_mbps);
    }
    j["extent_store"] = {{"write_mbps", Median(sw)},          {"read_mbps", Median(sr)},
                         {"raw_write_mbps", Median(rw)},      {"raw_read_mbps", Median(rr)},
                         {"write_mbps_runs", sw},             {"read_mbps_runs", sr},
                         {"raw_write_mbps_runs", rw},         {"raw_read_mbps_runs", rr},
                         {"shard_bytes", f_.shard_size},      {"shards", f_.shards},
                         {"checksum", std::string(ChecksumKindName(f_.checksum))},
                         {"sync_policy", std::string(SyncPolicyName(f_.store_sync))},
                         {"write_ratio", Median(wr)},          {"read_ratio", Median(rrat)},
                         {"write_ratio_runs", wr},             {"read_ratio_runs", rrat},
                         {"target_ratio", 0.97},
                         {"met", Median(wr) >= 0.97 && Median(rrat) >= 0.97}};
  }
  j["config"] = {{"dir", f_.dir},
                 {"file_size", f_.file_size},
                 {"runtime_s", absl::ToDoubleSeconds(f_.runtime)},
                 {"pairs_per_point", f_.reps},
                 {"registered_buffers_and_files", f_.register_buffers},
                 {"sqpoll", f_.sqpoll},
                 {"huge_page_buffers", f_.thp},
                 {"fio_iomem", f_.fio_iomem},
                 {"load_average_at_start", {load_[0], load_[1], load_[2]}}};
  std::ofstream out(f_.json_path);
  out << j.dump(2) << "\n";
  if (!out) return absl::UnavailableError(absl::StrCat("writing ", f_.json_path, " failed"));
  std::printf("\nwrote %s\n", f_.json_path.c_str());
  return absl::OkStatus();
}

absl::Status IoBench::Run() {
  STRATA_RETURN_IF_ERROR(Prepare());
  if (f_.tune) {
    STRATA_RETURN_IF_ERROR(RunTune());
  } else {
    if (f_.matrix) {
      STRATA_RETURN_IF_ERROR(RunMatrix());
      PrintTargets();
    }
    if (f_.ds_io) STRATA_RETURN_IF_ERROR(RunDsIo());
    if (f_.store) STRATA_RETURN_IF_ERROR(RunSwapPath());
  }
  return WriteJson();
}

}  // namespace

int RunIoBench(int argc, char** argv) {
  Flags f;
  CommandLine cl("strata bench io");
  cl.AddString("dir", &f.dir,
               "directory on the NVMe to test (default: the nvme_path of --deepspeed_config, else "
               "$STRATA_NVME_PATH)");
  cl.AddString("deepspeed_config", &f.deepspeed_config, "DeepSpeed JSON config whose offload nvme_path to use");
  cl.AddParsed("file_size", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.file_size, ParseBlockSize(v));
    if (f.file_size < (64 << 20)) return absl::InvalidArgumentError("--file_size must be at least 64MiB");
    return absl::OkStatus();
  }, "size of the test file (default 1GiB)");
  cl.AddParsed("runtime", [&](absl::string_view v) -> absl::Status {
    if (!absl::ParseDuration(v, &f.runtime) || f.runtime <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("--runtime '", v, "' is not a positive duration such as 1.5s"));
    }
    f.runtime_given = true;
    return absl::OkStatus();
  }, "seconds per run, e.g. 1.5s (default 1.5s; 1s with --tune)");
  cl.AddParsed("reps", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.reps, ParseU32(v, 1, 100));
    return absl::OkStatus();
  }, "ours/fio pairs per point (default 2)");
  cl.AddParsed("engines", [&](absl::string_view v) -> absl::Status {
    f.engines_given = true;
    return ParseList(v, &f.engines, ParseIoEngineKind);
  }, "comma list of io_uring, libaio, psync (default all)");
  cl.AddParsed("block_sizes", [&](absl::string_view v) -> absl::Status {
    f.block_sizes_given = true;
    STRATA_RETURN_IF_ERROR(ParseList(v, &f.block_sizes, ParseBlockSize));
    for (uint64_t bs : f.block_sizes) {
      if (bs % 4096 != 0 || bs == 0 || bs > (64 << 20)) {
        return absl::InvalidArgumentError("--block_sizes must be multiples of 4KiB up to 64MiB");
      }
    }
    return absl::OkStatus();
  }, "comma list; K/M/G are binary as in fio (default 128K,1M,8M)");
  cl.AddParsed("depths", [&](absl::string_view v) -> absl::Status {
    f.depths_given = true;
    return ParseList(v, &f.depths, [](absl::string_view s) { return ParseU32(s, 1, 1024); });
  }, "comma list of queue depths (default 1,8,32)");
  cl.AddParsed("ops", [&](absl::string_view v) -> absl::Status {
    return ParseList(v, &f.ops, [](absl::string_view s) -> absl::StatusOr<IoOp> {
      if (s == "read") return IoOp::kRead;
      if (s == "write") return IoOp::kWrite;
      return absl::InvalidArgumentError(absl::StrCat("op '", s, "': use read or write"));
    });
  }, "read,write (default both)");
  cl.AddBool("fio", &f.fio, "run fio as the peer in the same invocation (default on; --nofio)");
  cl.AddBool("register", &f.register_buffers,
             "io_uring registered buffers and files, fio --fixedbufs --registerfiles (default on)");
  cl.AddBool("sqpoll", &f.sqpoll, "io_uring SQPOLL for ours and fio (default off)");
  cl.AddBool("thp", &f.thp,
             "our I/O buffers on transparent huge pages, as strata's pinned arenas are (default on); "
             "--nothp gives ours memory like fio's malloc'd buffers (default pages, not pre-touched)");
  cl.AddString("fio_iomem", &f.fio_iomem,
               "passed to fio as --iomem, e.g. mmaphuge:/dev/hugepages/f to give fio huge-page buffers too");
  cl.AddBool("fio_huge", &f.fio_huge,
             "also run fio with its buffers on transparent huge pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1), "
             "engine against engine (default on; --nofio_huge)");
  cl.AddBool("ds_io", &f.ds_io,
             "measure DeepSpeed's aio_handle (ds_io) on the same file, block sizes and depths, alternating with "
             "ours (default on; needs the venv with DeepSpeed; --nods_io)");
  cl.AddParsed("ds_io_engine", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.ds_io_engine, ParseIoEngineKind(v));
    return absl::OkStatus();
  }, "our engine set against ds_io (default io_uring)");
  cl.AddString("python", &f.python,
               "Python with DeepSpeed for the ds_io peer (default $STRATA_PYTHON, else <repo>/.venv/bin/python)");
  cl.AddBool("make_venv", &f.make_venv, "create the venv with scripts/venv.sh when none is found");
  cl.AddBool("tune", &f.tune, "sweep block size x depth for the first engine and print the best as config");
  cl.AddBool("matrix", &f.matrix, "run the engine x op x block size x depth matrix (default on)");
  cl.AddBool("store", &f.store, "also measure the ExtentStore swap path (default on)");
  cl.AddString("json", &f.json_path, "write results as JSON to this file");
  cl.AddParsed("shard_size", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.shard_size, ParseBlockSize(v));
    if (f.shard_size == 0 || f.shard_size % 4096 != 0) return absl::InvalidArgumentError("--shard_size must be a multiple of 4KiB");
    return absl::OkStatus();
  }, "swap path shard size (default 64MiB)");
  cl.AddParsed("shards", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.shards, ParseU32(v, 1, 4096));
    return absl::OkStatus();
  }, "swap path shards per pass (default 8)");
  cl.AddParsed("store_reps", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.store_reps, ParseU32(v, 1, 100));
    return absl::OkStatus();
  }, "swap path rounds (default 3)");
  cl.AddParsed("checksum", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.checksum, ParseChecksumKind(v));
    return absl::OkStatus();
  }, "xxh3 or crc32c (default xxh3)");
  cl.AddParsed("store_sync", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.store_sync, ParseSyncPolicy(v));
    return absl::OkStatus();
  }, "fdatasync policy for the swap path: every_commit, batched, never (default never, like the raw engine)");
  cl.AddParsed("store_engine", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.store_engine, ParseIoEngineKind(v));
    return absl::OkStatus();
  }, "engine for the swap path (default io_uring)");
  cl.AddParsed("store_block_size", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.store_block_size, ParseBlockSize(v));
    return absl::OkStatus();
  }, "engine block size for the swap path (default 1M)");
  cl.AddParsed("store_depth", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.store_depth, ParseU32(v, 1, 1024));
    return absl::OkStatus();
  }, "engine queue depth for the swap path (default 32)");

  absl::Status s = cl.Parse(argc, argv);
  if (cl.help_requested()) {
    std::printf("%s", cl.Usage().c_str());
    return 0;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "strata bench io: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (f.dir.empty() && !f.deepspeed_config.empty()) {
    absl::StatusOr<DeepSpeedConfig> ds = LoadDeepSpeedConfigFile(f.deepspeed_config);
    if (!ds.ok()) {
      std::fprintf(stderr, "strata bench io: %s\n", std::string(ds.status().message()).c_str());
      return 2;
    }
    f.dir = !ds->zero.offload_optimizer.nvme_path.empty() ? ds->zero.offload_optimizer.nvme_path
                                                          : ds->zero.offload_param.nvme_path;
  }
  if (f.dir.empty()) {
    const char* env = std::getenv("STRATA_NVME_PATH");
    if (env != nullptr) f.dir = env;
  }
  if (f.dir.empty()) {
    std::fprintf(stderr,
                 "strata bench io: no directory: pass --dir DIR on the NVMe to test (or --deepspeed_config with an "
                 "offload nvme_path, or set STRATA_NVME_PATH)\n");
    return 2;
  }
  if (f.tune) {
    if (!f.engines_given) f.engines = {IoEngineKind::kUring};
    if (!f.block_sizes_given) f.block_sizes = {128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20};
    if (!f.depths_given) f.depths = {1, 2, 4, 8, 16, 32, 64};
    if (!f.runtime_given) f.runtime = absl::Seconds(1);
    f.reps = std::min<uint32_t>(f.reps, 1);
  }
  IoBench bench(f);
  absl::Status r = bench.Run();
  if (!r.ok()) {
    std::fprintf(stderr, "strata bench io: %s\n", r.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata
