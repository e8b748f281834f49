#include "bench/tiers_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/daemon_launcher.h"
#include "bench/io_measure.h"
#include "bench/sample_stats.h"
#include "bench/tiers_cuda_peer.h"
#include "core/byte_size.h"
#include "core/command_line.h"
#include "core/shard_key.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "swap/aligned_buffer.h"
#include "swap/extent_store.h"
#include "swap/io_engine.h"
#include "tiers/cuda_device_factory.h"
#include "tiers/device.h"
#include "tiers/emulated_device.h"
#include "tiers/pinned_arena.h"

namespace strata {
namespace {

struct Flags {
  std::string device = "auto";  // auto | cuda | emulated
  uint64_t total_bytes = 512ull << 20;
  uint64_t chunk_bytes = 64ull << 20;
  int rounds = 3;
  std::string dir = "/var/tmp";
  std::string json_path;
};

struct Row {
  std::string path;       // "pinned->device", ...
  double ours_gbps = 0;
  std::string peer;       // what the peer is
  double peer_gbps = 0;
  double ratio() const { return peer_gbps > 0 ? ours_gbps / peer_gbps : 0; }
};

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Picks the device: a GPU when asked or found, else the emulated one (host
// memory, no modelled cost: its copies are memcpy, which the peer measures).
// The emulated device is built as stratad builds its arena
// (daemon/device_arena.h): a shared memfd a trainer maps.
absl::StatusOr<std::unique_ptr<Device>> OpenDevice(const Flags& f, std::string* note) {
  if (f.device != "emulated") {
    CudaDeviceOptions o;
    o.arena_bytes = f.total_bytes;
    auto cuda = NewCudaDevice(o);
    if (cuda.ok()) return std::move(*cuda);
    if (f.device == "cuda") return cuda.status();
    *note = absl::StrCat("no GPU (", cuda.status().message(), "): emulated device");
  }
  EmulatedDeviceOptions o;
  o.capacity_bytes = f.total_bytes;
  o.shared_memory = true;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<EmulatedDevice> d, EmulatedDevice::Create(o));
  return std::unique_ptr<Device>(std::move(d));
}

// Best-of-rounds rate of `pass` (which moves f.total_bytes), in GB/s.
template <class Pass>
absl::StatusOr<double> BestRate(const Flags& f, const Pass& pass) {
  double best = 0;
  for (int r = 0; r < f.rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    STRATA_RETURN_IF_ERROR(pass());
    best = std::max(best, static_cast<double>(f.total_bytes) / Seconds(start) / 1e9);
  }
  return best;
}

class TiersBench {
 public:
  explicit TiersBench(Flags f) : f_(std::move(f)) {}

  absl::Status Run() {
    std::string note;
    STRATA_ASSIGN_OR_RETURN(device_, OpenDevice(f_, &note));
    const bool cuda = device_->info().name != "emulated";
    STRATA_ASSIGN_OR_RETURN(stream_, device_->CreateStream());
    STRATA_ASSIGN_OR_RETURN(buffer_, device_->Allocate(f_.total_bytes));
    PinnedArenaOptions po;
    po.name = "strata-bench-tiers";
    po.size_bytes = f_.total_bytes;
    STRATA_ASSIGN_OR_RETURN(pinned_, PinnedArena::Create(po));
    std::mt19937_64 rng(11);
    for (uint64_t i = 0; i + 8 <= f_.total_bytes; i += 8) {
      const uint64_t v = rng();
      std::memcpy(pinned_.data() + i, &v, 8);
    }
    std::printf("device: %s%s%s; pinned arena %s (%s); %s in %s chunks, best of %d rounds\n",
                device_->info().name.c_str(), note.empty() ? "" : " -- ", note.c_str(),
                FormatBytes(f_.total_bytes).c_str(), pinned_.locked() ? "mlocked" : pinned_.lock_note().c_str(),
                FormatBytes(f_.total_bytes).c_str(), FormatBytes(f_.chunk_bytes).c_str(), f_.rounds);
    std::printf("load average at start: %s\n\n", LoadAverageText().c_str());

    // pinned <-> device
    STRATA_ASSIGN_OR_RETURN(double h2d, BestRate(f_, [&] { return DeviceCopies(true); }));
    STRATA_ASSIGN_OR_RETURN(double d2h, BestRate(f_, [&] { return DeviceCopies(false); }));
    Row up{"pinned->device", h2d, "", 0}, down{"device->pinned", d2h, "", 0};
    if (cuda) {
      auto peer = MeasureCudaMemcpyPeer(f_.total_bytes, f_.chunk_bytes, f_.rounds);
      up.peer = down.peer = peer.ok() ? "cudaMemcpyAsync, cudaHostAlloc" : std::string(peer.status().message());
      if (peer.ok()) {
        up.peer_gbps = peer->h2d_gbps;
        down.peer_gbps = peer->d2h_gbps;
      }
    } else {
      STRATA_ASSIGN_OR_RETURN(AlignedBuffer other, AlignedBuffer::Allocate(f_.total_bytes));
      STRATA_ASSIGN_OR_RETURN(double mc, BestRate(f_, [&] {
        for (uint64_t off = 0; off < f_.total_bytes; off += f_.chunk_bytes) {
          std::memcpy(other.data() + off, pinned_.data() + off, std::min(f_.chunk_bytes, f_.total_bytes - off));
        }
        return absl::OkStatus();
      }));
      up.peer = down.peer = "memcpy host->host";
      up.peer_gbps = down.peer_gbps = mc;
    }
    rows_.push_back(up);
    rows_.push_back(down);

    // pinned <-> NVMe: the swap path against the raw engine (bench io's pair).
    SwapPathRun sr;
    sr.dir = f_.dir;
    sr.shard_bytes = f_.chunk_bytes;
    sr.shards = static_cast<uint32_t>(std::max<uint64_t>(1, f_.total_bytes / f_.chunk_bytes));
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<SwapPathBench> swap, SwapPathBench::Create(sr));
    SwapPathResult best;
    for (int r = 0; r < f_.rounds; ++r) {
      STRATA_ASSIGN_OR_RETURN(SwapPathResult s, swap->Round(r % 2 == 0));
      best.store_write_mbps = std::max(best.store_write_mbps, s.store_write_mbps);
      best.store_read_mbps = std::max(best.store_read_mbps, s.store_read_mbps);
      best.raw_write_mbps = std::max(best.raw_write_mbps, s.raw_write_mbps);
      best.raw_read_mbps = std::max(best.raw_read_mbps, s.raw_read_mbps);
    }
    swap.reset();
    rows_.push_back({"pinned->nvme", best.store_write_mbps / 1e3, "raw io engine, same bytes", best.raw_write_mbps / 1e3});
    rows_.push_back({"nvme->pinned", best.store_read_mbps / 1e3, "raw io engine, same bytes", best.raw_read_mbps / 1e3});

    // device <-> NVMe through two staging chunks of the pinned arena.
    STRATA_RETURN_IF_ERROR(OpenStore());
    STRATA_ASSIGN_OR_RETURN(double n2d, BestRate(f_, [&] { return NvmeToDevice(); }));
    STRATA_ASSIGN_OR_RETURN(double d2n, BestRate(f_, [&] { return DeviceToNvme(); }));
    rows_.push_back({"nvme->device", n2d, "min(nvme->pinned, pinned->device)",
                     std::min(best.store_read_mbps / 1e3, h2d)});
    rows_.push_back({"device->nvme", d2n, "min(device->pinned, pinned->nvme)",
                     std::min(best.store_write_mbps / 1e3, d2h)});
    store_.reset();
    engine_.reset();
    std::filesystem::remove_all(store_dir_);

    std::printf("%-16s %10s %10s %7s  %s\n", "path", "ours GB/s", "peer GB/s", "ratio", "peer");
    for (const Row& r : rows_) {
      std::printf("%-16s %10.2f %10.2f %7.3f  %s\n", r.path.c_str(), r.ours_gbps, r.peer_gbps, r.ratio(),
                  r.peer.c_str());
    }
    std::printf("\nload average at end: %s\n", LoadAverageText().c_str());
    if (f_.json_path.empty()) return absl::OkStatus();
    nlohmann::json j;
    j["device"] = device_->info().name;
    j["total_bytes"] = f_.total_bytes;
    j["chunk_bytes"] = f_.chunk_bytes;
    j["load_average"] = LoadAverageText();
    for (const Row& r : rows_) {
      j["results"].push_back({{"path", r.path}, {"ours_gbps", r.ours_gbps}, {"peer", r.peer},
                              {"peer_gbps", r.peer_gbps}, {"ratio", r.ratio()}});
    }
    return WriteBenchJson(f_.json_path, j.dump(2));
  }

 private:
  absl::Status DeviceCopies(bool to_device) {
    for (uint64_t off = 0; off < f_.total_bytes; off += f_.chunk_bytes) {
      const uint64_t n = std::min(f_.chunk_bytes, f_.total_bytes - off);
      STRATA_RETURN_IF_ERROR(to_device ? device_->CopyToDevice(buffer_, off, pinned_.data() + off, n, stream_)
                                       : device_->CopyToHost(pinned_.data() + off, buffer_, off, n, stream_));
    }
    STRATA_ASSIGN_OR_RETURN(EventId e, device_->RecordEvent(stream_));
    return device_->WaitEvent(e);
  }

  absl::Status OpenStore() {
    store_dir_ = absl::StrCat(f_.dir, "/strata-bench-tiers-", getpid());
    std::filesystem::create_directories(store_dir_);
    IoEngineOptions io;
    io.queue_depth = 8;
    std::vector<std::string> notes;
    STRATA_ASSIGN_OR_RETURN(engine_, OpenIoEngine(io, std::nullopt, &notes));
    ExtentStoreOptions so;
    so.paths = {store_dir_};
    so.capacity_bytes_per_path = 2 * f_.total_bytes + (64ull << 20);
    so.sync_policy = SyncPolicy::kNever;
    STRATA_ASSIGN_OR_RETURN(store_, ExtentStore::Open(so, engine_.get()));
    for (uint32_t c = 0; c * f_.chunk_bytes < f_.total_bytes; ++c) {
      const uint64_t off = c * f_.chunk_bytes;
      STRATA_RETURN_IF_ERROR(store_->Write(Key(c), absl::MakeSpan(pinned_.data() + off,
                                                                  std::min(f_.chunk_bytes, f_.total_bytes - off))));
    }
    return store_->Commit();
  }

  static ShardKey Key(uint32_t chunk) {
    return ShardKey{JobId(1), Rank(0), TensorId(chunk), TensorKind::kParam16, 0};
  }

  // Staging chunk s (of two) at the front of the pinned arena.
  absl::Span<std::byte> Staging(int s) {
    return absl::MakeSpan(pinned_.data() + static_cast<uint64_t>(s) * f_.chunk_bytes, f_.chunk_bytes);
  }

  // Read chunk k from NVMe into staging k%2 while the device copy of chunk
  // k-1 (from the other staging chunk) is in flight.
  absl::Status NvmeToDevice() {
    std::optional<EventId> pending[2];
    for (uint32_t c = 0; c * f_.chunk_bytes < f_.total_bytes; ++c) {
      const int s = static_cast<int>(c % 2);
      if (pending[s]) STRATA_RETURN_IF_ERROR(device_->WaitEvent(*pending[s]));
      pending[s].reset();
      STRATA_ASSIGN_OR_RETURN(uint64_t n, store_->Read(Key(c), Staging(s)));
      STRATA_RETURN_IF_ERROR(device_->CopyToDevice(buffer_, c * f_.chunk_bytes, Staging(s).data(), n, stream_));
      STRATA_ASSIGN_OR_RETURN(EventId e, device_->RecordEvent(stream_));
      pending[s] = e;
    }
    for (auto& p : pending) {
      if (p) STRATA_RETURN_IF_ERROR(device_->WaitEvent(*p));
    }
    return absl::OkStatus();
  }

  // Copy chunk k+1 device->staging while chunk k is written to NVMe.
  absl::Status DeviceToNvme() {
    const uint32_t chunks = static_cast<uint32_t>((f_.total_bytes + f_.chunk_bytes - 1) / f_.chunk_bytes);
    auto size_of = [&](uint32_t c) { return std::min(f_.chunk_bytes, f_.total_bytes - c * f_.chunk_bytes); };
    auto start_copy = [&](uint32_t c) -> absl::StatusOr<EventId> {
      STRATA_RETURN_IF_ERROR(
          device_->CopyToHost(Staging(c % 2).data(), buffer_, c * f_.chunk_bytes, size_of(c), stream_));
      return device_->RecordEvent(stream_);
    };
    STRATA_ASSIGN_OR_RETURN(EventId next, start_copy(0));
    for (uint32_t c = 0; c < chunks; ++c) {
      STRATA_RETURN_IF_ERROR(device_->WaitEvent(next));
      if (c + 1 < chunks) {
        STRATA_ASSIGN_OR_RETURN(next, start_copy(c + 1));
      }
      STRATA_RETURN_IF_ERROR(store_->Write(Key(c), Staging(c % 2).first(size_of(c))));
    }
    return store_->Commit();
  }

  Flags f_;
  std::unique_ptr<Device> device_;
  StreamId stream_;
  DeviceBuffer buffer_;
  PinnedArena pinned_;
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<ExtentStore> store_;
  std::string store_dir_;
  std::vector<Row> rows_;
};

}  // namespace

int RunTiersBench(int argc, char** argv) {
  Flags f;
  CommandLine cl("strata bench tiers");
  cl.AddParsed("device", [&](absl::string_view v) -> absl::Status {
    if (v != "auto" && v != "cuda" && v != "emulated") {
      return absl::InvalidArgumentError(absl::StrCat("--device '", v, "': use auto, cuda or emulated"));
    }
    f.device = std::string(v);
    return absl::OkStatus();
  }, "auto (a GPU when one answers, else emulated), cuda or emulated (default auto)");
  cl.AddParsed("size", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.total_bytes, ParseByteSize(v));
    return absl::OkStatus();
  }, "bytes moved per pass and direction (default 512MiB)");
  cl.AddParsed("chunk", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(f.chunk_bytes, ParseByteSize(v));
    return absl::OkStatus();
  }, "bytes per copy / shard (default 64MiB; a multiple of 1MiB)");
  cl.AddParsed("rounds", [&](absl::string_view v) -> absl::Status {
    STRATA_ASSIGN_OR_RETURN(uint64_t n, ParseCount(v));
    if (n < 1 || n > 100) return absl::InvalidArgumentError("--rounds: 1 to 100");
    f.rounds = static_cast<int>(n);
    return absl::OkStatus();
  }, "rounds per measurement; the best is reported (default 3)");
  cl.AddString("dir", &f.dir, "directory on the NVMe for the store and raw file (default /var/tmp; never tmpfs)");
  cl.AddString("json", &f.json_path, "write results as JSON to this file");
  if (absl::Status s = cl.Parse(argc, argv); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (cl.help_requested()) {
    std::printf("%s", cl.Usage().c_str());
    return 0;
  }
  if (f.chunk_bytes == 0 || f.chunk_bytes % (1 << 20) != 0 || f.total_bytes < 2 * f.chunk_bytes ||
      f.total_bytes % f.chunk_bytes != 0) {
    std::fprintf(stderr,
                 "strata bench tiers: --chunk must be a positive multiple of 1MiB and --size a multiple of at "
                 "least two chunks (got --size %s --chunk %s)\n",
                 FormatBytes(f.total_bytes).c_str(), FormatBytes(f.chunk_bytes).c_str());
    return 2;
  }
  TiersBench bench(std::move(f));
  if (absl::Status s = bench.Run(); !s.ok()) {
    std::fprintf(stderr, "strata bench tiers: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace strata
