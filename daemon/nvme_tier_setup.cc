#include "daemon/nvme_tier_setup.h"

#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/byte_size.h"

namespace strata {
namespace {

// I/O lanes of the NVMe extent store: a job's tile load and save plus its
// param reads, for a few jobs at once.
constexpr int kNvmeIoLanes = 4;

std::optional<IoEngineKind> ForcedKind(IoEngineChoice choice) {
  switch (choice) {
    case IoEngineChoice::kUring: return IoEngineKind::kUring;
    case IoEngineChoice::kAio: return IoEngineKind::kAio;
    case IoEngineChoice::kPsync: return IoEngineKind::kPsync;
    case IoEngineChoice::kAuto: break;
  }
  return std::nullopt;
}

SyncPolicy SyncPolicyOf(FsyncPolicy policy) {
  switch (policy) {
    case FsyncPolicy::kEveryCommit: return SyncPolicy::kEveryCommit;
    case FsyncPolicy::kBatched: return SyncPolicy::kBatched;
    case FsyncPolicy::kNever: return SyncPolicy::kNever;
  }
  return SyncPolicy::kEveryCommit;
}

}  // namespace

absl::StatusOr<NvmeTierParts> OpenNvmeTier(const DaemonSettings& settings, const IoEngineDecorator* io_decorator,
                                           std::vector<std::string>* choices) {
  for (const std::string& path : settings.nvme_paths) {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("nvme path ", path, " cannot be created: ", ec.message()));
  }
  IoEngineOptions io;
  io.queue_depth = settings.io_queue_depth;
  io.block_size_bytes = settings.io_block_size;
  io.sqpoll = settings.io_sqpoll;
  const bool wrapped = io_decorator != nullptr && io_decorator->wrap;
  if (io_decorator != nullptr) io.result_hook = io_decorator->result_hook;

  NvmeTierParts parts;
  std::vector<std::string> notes;
  auto engine = OpenIoEngine(io, ForcedKind(settings.io_engine), &notes);
  if (!engine.ok()) return engine.status();
  parts.engine = std::move(*engine);
  if (wrapped) parts.engine = io_decorator->wrap(std::move(parts.engine));
  const IoEngineInfo& info = parts.engine->info();
  for (const std::string& n : notes) choices->push_back(absl::StrCat("io engine: ", n));
  for (const std::string& n : info.notes) choices->push_back(absl::StrCat("io engine: ", n));
  choices->push_back(absl::StrCat("io engine: ", info.name, " (depth ", info.queue_depth, ", block ",
                                  FormatBytes(info.block_size_bytes), ")"));

  // The other lanes are of the same kind as the first engine, whatever chose it.
  auto kind = ParseIoEngineKind(info.name);
  if (!kind.ok()) return kind.status();
  std::vector<IoEngine*> lanes = {parts.engine.get()};
  for (int i = 1; i < kNvmeIoLanes; ++i) {
    std::vector<std::string> ignored;  // the first engine's notes said it all
    auto lane = OpenIoEngine(io, *kind, &ignored);
    if (!lane.ok()) return lane.status();
    if (wrapped) *lane = io_decorator->wrap(std::move(*lane));
    lanes.push_back(lane->get());
    parts.lane_engines.push_back(std::move(*lane));
  }

  ExtentStoreOptions store;
  store.paths = settings.nvme_paths;
  store.capacity_bytes_per_path = settings.nvme_capacity_bytes;
  store.allow_buffered_fallback = true;
  store.sync_policy = SyncPolicyOf(settings.fsync_policy);
  auto nvme = ExtentStore::Open(store, absl::MakeConstSpan(lanes));
  if (!nvme.ok()) {
    return absl::Status(nvme.status().code(), absl::StrCat("opening the NVMe tier: ", nvme.status().message()));
  }
  parts.store = std::move(*nvme);
  for (const std::string& w : parts.store->warnings()) choices->push_back(absl::StrCat("nvme: ", w));
  const ExtentStoreStats stats = parts.store->Stats();
  choices->push_back(absl::StrCat("nvme tier: ", stats.shard_count, " shards found, ",
                                  FormatBytes(stats.capacity_bytes), " capacity"));
  return parts;
}

}  // namespace strata
