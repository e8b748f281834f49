#include "bench/io_measure.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/errno_status.h"
#include "core/status_macros.h"
#include "swap/direct_io.h"

namespace strata {
namespace {

// Submits and reaps until every request has completed OK.
absl::Status RunToCompletion(IoEngine& engine, std::vector<IoRequest>& requests) {
  size_t submitted = 0;
  std::vector<IoCompletion> done;
  while (submitted < requests.size() || engine.outstanding() > 0) {
    if (submitted < requests.size()) {
      STRATA_ASSIGN_OR_RETURN(size_t n, engine.Submit(absl::MakeConstSpan(requests).subspan(submitted)));
      submitted += n;
    }
    done.clear();
    STRATA_RETURN_IF_ERROR(engine.Reap(1, absl::InfiniteDuration(), &done));
    for (const IoCompletion& c : done) STRATA_RETURN_IF_ERROR(c.status);
  }
  return absl::OkStatus();
}

double Mbps(uint64_t bytes, absl::Duration d) { return bytes / absl::ToDoubleSeconds(d) / 1e6; }

}  // namespace

absl::StatusOr<double> MeasureEngine(const EngineRun& run, int fd, const std::string& path,
                                     uint64_t file_size_bytes, const AlignedBuffer& buffers) {
  IoEngineOptions o;
  o.queue_depth = run.queue_depth;
  o.block_size_bytes = run.block_size_bytes;
  o.register_buffers = run.register_buffers_and_files;
  o.register_files = run.register_buffers_and_files;
  o.sqpoll = run.sqpoll;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, NewIoEngine(run.engine, o));
  STRATA_ASSIGN_OR_RETURN(IoFileId file, engine->RegisterFile(fd, path));
  uint64_t in_flight_bytes = run.block_size_bytes * run.queue_depth;
  if (buffers.size() < in_flight_bytes) {
    return absl::InvalidArgumentError("bench buffers smaller than depth x block size");
  }
  // Regions of at most 1 GiB each (the kernel's limit per fixed buffer).
  std::vector<IoEngine::BufferRegion> regions;
  for (uint64_t off = 0; off < in_flight_bytes; off += (uint64_t{1} << 30)) {
    regions.push_back({buffers.data() + off, std::min<uint64_t>(uint64_t{1} << 30, in_flight_bytes - off)});
  }
  STRATA_RETURN_IF_ERROR(engine->RegisterBuffers(regions));

  uint64_t span = file_size_bytes - file_size_bytes % run.block_size_bytes;
  uint64_t cursor = 0;
  auto next_request = [&](uint64_t slot) {
    IoRequest r{run.op, file, cursor, buffers.data() + slot * run.block_size_bytes,
                run.block_size_bytes, slot};
    cursor += run.block_size_bytes;
    if (cursor >= span) cursor = 0;
    return r;
  };
  std::vector<IoRequest> batch;
  for (uint32_t s = 0; s < run.queue_depth; ++s) batch.push_back(next_request(s));
  std::vector<IoCompletion> done;
  uint64_t bytes = 0;
  absl::Time start = absl::Now();
  absl::Time deadline = start + run.runtime;
  absl::Time last = start;
  STRATA_ASSIGN_OR_RETURN(size_t n, engine->Submit(batch));
  if (n != batch.size()) return absl::InternalError("engine refused the initial batch");
  while (engine->outstanding() > 0) {
    done.clear();
    STRATA_RETURN_IF_ERROR(engine->Reap(1, absl::InfiniteDuration(), &done));
    absl::Time now = absl::Now();
    batch.clear();
    for (const IoCompletion& c : done) {
      if (!c.status.ok()) return c.status;
      bytes += run.block_size_bytes;
      last = now;
      if (now < deadline) batch.push_back(next_request(c.user_data));
    }
    if (!batch.empty()) {
      STRATA_ASSIGN_OR_RETURN(size_t m, engine->Submit(batch));
      if (m != batch.size()) return absl::InternalError("engine refused a resubmission");
    }
  }
  return Mbps(bytes, last - start);
}

absl::Status FillFile(int fd, const std::string& path, uint64_t bytes) {
  IoEngineOptions o;
  o.queue_depth = 16;
  o.block_size_bytes = 1 << 20;
  std::vector<std::string> notes;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, OpenIoEngine(o, std::nullopt, &notes));
  STRATA_ASSIGN_OR_RETURN(IoFileId file, engine->RegisterFile(fd, path));
  STRATA_ASSIGN_OR_RETURN(AlignedBuffer buf, AlignedBuffer::Allocate(16 << 20));
  std::mt19937_64 rng(301);
  for (size_t i = 0; i + 8 <= buf.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(buf.data() + i, &v, 8);
  }
  std::vector<IoRequest> reqs;
  for (uint64_t off = 0; off < bytes; off += buf.size()) {
    reqs.push_back(IoRequest{IoOp::kWrite, file, off, buf.data(), std::min<uint64_t>(buf.size(), bytes - off), off});
  }
  STRATA_RETURN_IF_ERROR(RunToCompletion(*engine, reqs));
  if (fdatasync(fd) != 0) return ErrnoToStatus(errno, absl::StrCat("fdatasync of ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SwapPathBench>> SwapPathBench::Create(const SwapPathRun& run) {
  std::unique_ptr<SwapPathBench> b(new SwapPathBench());
  b->run_ = run;
  IoEngineOptions o;
  o.queue_depth = run.queue_depth;
  o.block_size_bytes = run.block_size_bytes;
  STRATA_ASSIGN_OR_RETURN(b->store_engine_, NewIoEngine(run.engine, o));
  STRATA_ASSIGN_OR_RETURN(b->raw_engine_, NewIoEngine(run.engine, o));
  STRATA_ASSIGN_OR_RETURN(b->src_, AlignedBuffer::Allocate(run.shard_bytes));
  STRATA_ASSIGN_OR_RETURN(b->dst_, AlignedBuffer::Allocate(run.shard_bytes));
  std::mt19937_64 rng(7);
  for (size_t i = 0; i + 8 <= b->src_.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(b->src_.data() + i, &v, 8);
  }
  std::vector<IoEngine::BufferRegion> regions = {{b->src_.data(), b->src_.size()},
                                                 {b->dst_.data(), b->dst_.size()}};

  // The store: room for every shard twice (each write goes to a fresh extent
  // and the old one is freed at commit), plus slack.
  b->store_dir_ = run.dir + "/strata-bench-store";
  std::error_code ec;
  std::filesystem::remove_all(b->store_dir_, ec);
  if (mkdir(b->store_dir_.c_str(), 0700) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("creating ", b->store_dir_));
  }
  ExtentStoreOptions so;
  so.paths = {b->store_dir_};
  so.capacity_bytes_per_path = 2 * run.shard_bytes * run.shards + (64 << 20);
  so.capacity_bytes_per_path -= so.capacity_bytes_per_path % so.allocation_unit_bytes;
  so.checksum = run.checksum;
  so.sync_policy = run.sync_policy;
  {
    // Write the preallocated data file once, so neither side pays for
    // converting unwritten extents (the raw file is filled the same way).
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ExtentStore> s, ExtentStore::Open(so, b->store_engine_.get()));
  }
  std::string data_file = b->store_dir_ + "/strata-extents.data";
  {
    STRATA_ASSIGN_OR_RETURN(OpenedFile f, OpenForIo(data_file, false, true, false));
    absl::Status s = FillFile(f.fd, data_file, so.capacity_bytes_per_path);
    close(f.fd);
    STRATA_RETURN_IF_ERROR(s);
  }
  STRATA_ASSIGN_OR_RETURN(b->store_, ExtentStore::Open(so, b->store_engine_.get()));
  STRATA_RETURN_IF_ERROR(b->store_engine_->RegisterBuffers(regions));

  b->raw_path_ = run.dir + "/strata-bench-raw.dat";
  STRATA_ASSIGN_OR_RETURN(OpenedFile raw, OpenForIo(b->raw_path_, true, true, false));
  b->raw_fd_ = raw.fd;
  uint64_t raw_bytes = run.shard_bytes * run.shards;
  if (posix_fallocate(b->raw_fd_, 0, static_cast<off_t>(raw_bytes)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("preallocating ", raw_bytes, " bytes at ", b->raw_path_));
  }
  STRATA_RETURN_IF_ERROR(FillFile(b->raw_fd_, b->raw_path_, raw_bytes));
  STRATA_ASSIGN_OR_RETURN(b->raw_file_, b->raw_engine_->RegisterFile(b->raw_fd_, b->raw_path_));
  STRATA_RETURN_IF_ERROR(b->raw_engine_->RegisterBuffers(regions));
  return b;
}

SwapPathBench::~SwapPathBench() {
  store_.reset();
  raw_engine_.reset();
  if (raw_fd_ >= 0) close(raw_fd_);
  if (!raw_path_.empty()) unlink(raw_path_.c_str());
  std::error_code ec;
  if (!store_dir_.empty()) std::filesystem::remove_all(store_dir_, ec);
}

absl::StatusOr<double> SwapPathBench::RawPass(IoOp op) {
  // One request per shard, as the store issues one Write/Read per shard; the
  // engine splits it into block-size pieces kept in flight together.
  absl::Time start = absl::Now();
  for (uint32_t i = 0; i < run_.shards; ++i) {
    std::vector<IoRequest> r = {IoRequest{op, raw_file_, uint64_t{i} * run_.shard_bytes,
                                          op == IoOp::kWrite ? src_.data() : dst_.data(), run_.shard_bytes, i}};
    STRATA_RETURN_IF_ERROR(RunToCompletion(*raw_engine_, r));
  }
  return Mbps(uint64_t{run_.shards} * run_.shard_bytes, absl::Now() - start);
}

absl::StatusOr<double> SwapPathBench::StorePass(IoOp op) {
  auto key = [](uint32_t i) {
    ShardKey k;
    k.job = JobId(1);
    k.tensor = TensorId(i);
    k.kind = TensorKind::kExpAvg;
    return k;
  };
  absl::Time start = absl::Now();
  for (uint32_t i = 0; i < run_.shards; ++i) {
    if (op == IoOp::kWrite) {
      STRATA_RETURN_IF_ERROR(store_->Write(key(i), src_.span()));
      STRATA_RETURN_IF_ERROR(store_->Commit());
    } else {
      STRATA_ASSIGN_OR_RETURN(uint64_t n, store_->Read(key(i), dst_.span()));
      if (n != run_.shard_bytes) return absl::InternalError("store read returned the wrong size");
    }
  }
  double mbps = Mbps(uint64_t{run_.shards} * run_.shard_bytes, absl::Now() - start);
  if (op == IoOp::kRead && std::memcmp(src_.data(), dst_.data(), src_.size()) != 0) {
    return absl::DataLossError("bench: a shard read back through the store differs from what was written");
  }
  return mbps;
}

absl::StatusOr<SwapPathResult> SwapPathBench::Round(bool store_first) {
  SwapPathResult r;
  for (IoOp op : {IoOp::kWrite, IoOp::kRead}) {
    double& store = op == IoOp::kWrite ? r.store_write_mbps : r.store_read_mbps;
    double& raw = op == IoOp::kWrite ? r.raw_write_mbps : r.raw_read_mbps;
    if (store_first) {
      STRATA_ASSIGN_OR_RETURN(store, StorePass(op));
      STRATA_ASSIGN_OR_RETURN(raw, RawPass(op));
    } else {
      STRATA_ASSIGN_OR_RETURN(raw, RawPass(op));
      STRATA_ASSIGN_OR_RETURN(store, StorePass(op));
    }
  }
  return r;
}

}  // namespace strata
