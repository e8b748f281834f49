#include "daemon/nvme_shard_state_store.h"

#include <chrono>
#include <cstring>
#include <future>

#include "absl/strings/str_cat.h"
#include "core/shard_key.h"
#include "core/status_macros.h"
#include "swap/extent_store.h"

namespace strata {

absl::StatusOr<std::unique_ptr<NvmeShardStateStore>> NvmeShardStateStore::Create(
    uint64_t job_id, const StateLayout& layout, ExtentStore* store, uint64_t tile_bytes) {
  if (store == nullptr) {
    return absl::FailedPreconditionError(
        "ZeRO-Infinity needs the NVMe tier: start stratad with --nvme_path DIR");
  }
  const uint64_t tile_elements = std::max<uint64_t>(tile_bytes / 4 / 1024 * 1024, 1024);
  return std::unique_ptr<NvmeShardStateStore>(new NvmeShardStateStore(job_id, layout, store, tile_elements));
}

absl::Status NvmeShardStateStore::EnsureStaging(uint64_t numel) {
  // The tile size fixes the NVMe layout (tile t of a shard is one extent), so
  // it never changes; the staging holds a tile of the largest shard, which
  // for small models is far less than a tile (a 64 MiB tile x 3 sets x 3
  // streams was 576 MiB pre-faulted for every job).
  const uint64_t need = std::min(tile_elements_, (numel + 1023) / 1024 * 1024);
  if (need <= stage_elements_) return absl::OkStatus();
  auto staging = AlignedBuffer::Allocate(3 * Streams().size() * need * 4, store_->alignment());
  if (!staging.ok()) return staging.status();
  staging_ = std::move(*staging);
  stage_elements_ = need;
  return absl::OkStatus();
}

NvmeShardStateStore::NvmeShardStateStore(uint64_t job_id, const StateLayout& layout, ExtentStore* store,
                                         uint64_t tile_elements)
    : job_id_(job_id),
      layout_(layout),
      store_(store),
      tile_elements_(tile_elements) {}

std::vector<TensorKind> NvmeShardStateStore::Streams() const {
  std::vector<TensorKind> kinds = {TensorKind::kMaster32};
  if (layout_.exp_avg) kinds.push_back(TensorKind::kExpAvg);
  if (layout_.exp_avg_sq) kinds.push_back(TensorKind::kExpAvgSq);
  if (layout_.max_exp_avg_sq) kinds.push_back(TensorKind::kMaxExpAvgSq);
  return kinds;
}

std::vector<NvmeShardStateStore::TileRef> NvmeShardStateStore::Tiles(
    const std::vector<ShardId>& shards) const {
  std::vector<TileRef> tiles;
  for (const ShardId& id : shards) {
    auto it = numel_.find({id.rank, id.index});
    const uint64_t numel = it == numel_.end() ? 0 : it->second;
    uint32_t t = 0;
    for (uint64_t off = 0; off < numel; off += tile_elements_, ++t) {
      tiles.push_back(TileRef{id, t, off, std::min(tile_elements_, numel - off)});
    }
  }
  return tiles;
}

StateTile NvmeShardStateStore::StagingTile(int set, const TileRef& ref) {
  const std::vector<TensorKind> streams = Streams();
  float* base = reinterpret_cast<float*>(staging_.data()) + set * streams.size() * stage_elements_;
  StateTile tile;
  tile.offset = ref.offset;
  tile.size = ref.size;
  for (size_t s = 0; s < streams.size(); ++s) {
    float* p = base + s * stage_elements_;
    switch (streams[s]) {
      case TensorKind::kMaster32: tile.master = p; break;
      case TensorKind::kExpAvg: tile.exp_avg = p; break;
      case TensorKind::kExpAvgSq: tile.exp_avg_sq = p; break;
      default: tile.max_exp_avg_sq = p; break;
    }
  }
  return tile;
}

absl::Status NvmeShardStateStore::Load(int set, const TileRef& ref) {
  const std::vector<TensorKind> streams = Streams();
  std::byte* base = staging_.data() + set * streams.size() * stage_elements_ * 4;
  for (size_t s = 0; s < streams.size(); ++s) {
    ShardKey key{JobId(job_id_), Rank(ref.shard.rank), TensorId(ref.shard.index), streams[s], ref.tile};
    auto got = store_->Read(key, absl::Span<std::byte>(base + s * stage_elements_ * 4, stage_elements_ * 4));
    if (!got.ok()) {
      return absl::Status(got.status().code(), absl::StrCat("loading ", ShardKeyToString(key),
                                                            " from NVMe: ", got.status().message()));
    }
    if (*got != ref.size * 4) {
      return absl::DataLossError(absl::StrCat(ShardKeyToString(key), " holds ", *got,
                                              " bytes on NVMe, expected ", ref.size * 4));
    }
  }
  return absl::OkStatus();
}

absl::Status NvmeShardStateStore::Save(int set, const TileRef& ref) {
  const std::vector<TensorKind> streams = Streams();
  const std::byte* base = staging_.data() + set * streams.size() * stage_elements_ * 4;
  for (size_t s = 0; s < streams.size(); ++s) {
    ShardKey key{JobId(job_id_), Rank(ref.shard.rank), TensorId(ref.shard.index), streams[s], ref.tile};
    absl::Status st = store_->Write(key, absl::Span<const std::byte>(base + s * stage_elements_ * 4, ref.size * 4));
    if (!st.ok()) {
      return absl::Status(st.code(), absl::StrCat("saving ", ShardKeyToString(key), " to NVMe: ", st.message()));
    }
  }
  return absl::OkStatus();
}

void NvmeShardStateStore::Preload(const std::vector<ShardId>& shards) {
  absl::MutexLock lock(&preload_mu_);
  if (!preloaded_.empty() || staging_.size() == 0) return;
  const std::vector<TileRef> tiles = Tiles(shards);
  for (size_t k = 0; k < tiles.size() && k < 3; ++k) {
    const TileRef ref = tiles[k];
    preloaded_.push_back(Preloaded{ref, std::async(std::launch::async, [this, k, ref] {
                                     return Load(static_cast<int>(k), ref);
                                   })});
  }
}

void NvmeShardStateStore::DropPreloads() {
  std::vector<Preloaded> pending;
  {
    absl::MutexLock lock(&preload_mu_);
    pending.swap(preloaded_);
  }
  for (Preloaded& p : pending) (void)p.load.get();  // an error here is the next load's to report
}

absl::Status NvmeShardStateStore::Create(uint32_t rank, uint32_t index, uint64_t numel) {
  DropPreloads();
  if (absl::Status s = EnsureStaging(numel); !s.ok()) return s;
  numel_[{rank, index}] = numel;
  // Zeroed states, written tile by tile from a zeroed staging set: only the
  // part of each stream's tile that a tile of this shard covers (zeroing
  // whole 64 MiB tiles for every small shard cost seconds per job).
  const size_t streams = Streams().size();
  const uint64_t used = std::min(numel, tile_elements_);
  for (size_t s = 0; s < streams; ++s) std::memset(staging_.data() + s * stage_elements_ * 4, 0, used * 4);
  for (const TileRef& ref : Tiles({ShardId{rank, index}})) {
    if (absl::Status s = Save(0, ref); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status NvmeShardStateStore::Adopt(uint32_t rank, uint32_t index, uint64_t numel) {
  DropPreloads();
  if (absl::Status s = EnsureStaging(numel); !s.ok()) return s;
  numel_[{rank, index}] = numel;
  for (const TileRef& ref : Tiles({ShardId{rank, index}})) {
    for (TensorKind kind : Streams()) {
      ShardKey key{JobId(job_id_), Rank(rank), TensorId(index), kind, ref.tile};
      if (!store_->Contains(key)) {
        return absl::NotFoundError(absl::StrCat(ShardKeyToString(key), " is missing from NVMe"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status NvmeShardStateStore::Run(const ShardSource& next, const TileFn& fn, bool write_back) {
  if (write_back) waits_ = {};
  std::vector<Preloaded> preloaded;
  {
    absl::MutexLock lock(&preload_mu_);
    preloaded.swap(preloaded_);
  }
  // Tile k is loaded into set k % 3, used, and saved from it. The tiles grow
  // as `next` gives shards; a preload of tile k (Preload) is this run's load
  // of it while the run's first tiles are the preloaded ones, and any other
  // is waited out before its set is loaded again.
  std::vector<TileRef> tiles;
  std::vector<std::future<absl::Status>> loads;
  std::vector<std::future<absl::Status>> saves;
  size_t claimed = 0;  // preloads taken as this run's loads, in order
  auto drop_unclaimed = [&] {
    for (size_t i = claimed; i < preloaded.size(); ++i) (void)preloaded[i].load.get();  // the next load reports errors
    preloaded.resize(claimed);
  };
  // Pulls shards until one adds a tile (a shard of no elements adds none);
  // false when `next` has none (now, or ever: see ShardSource).
  auto pull = [&](bool wait) {
    const size_t had = tiles.size();
    while (tiles.size() == had) {
      std::optional<ShardId> id = next(wait);
      if (!id.has_value()) return false;
      for (const TileRef& ref : Tiles({*id})) {
        const size_t k = tiles.size();
        tiles.push_back(ref);
        loads.emplace_back();
        saves.emplace_back();
        if (k == claimed && k < preloaded.size() && preloaded[k].ref == ref) {
          loads[k] = std::move(preloaded[k].load);
          ++claimed;
        } else {
          drop_unclaimed();
        }
      }
    }
    return true;
  };
  auto start_load = [&](size_t k) {
    if (!loads[k].valid()) {
      loads[k] = std::async(std::launch::async, [this, k, ref = tiles[k]] { return Load(k % 3, ref); });
    }
  };
  if (!pull(/*wait=*/true)) {
    drop_unclaimed();
    return absl::OkStatus();
  }
  // How long this thread blocks on the I/O: the breakdown GetStats shows.
  UpdateWaits waits;
  auto wait_for = [](std::future<absl::Status>& f, double& total) {
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status s = f.get();
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return s;
  };
  // Loading tile k+1 needs the set that tile k-2 was saved from.
  auto load_next = [&](size_t k) -> absl::Status {
    if (k >= 2 && saves[k - 2].valid()) STRATA_RETURN_IF_ERROR(wait_for(saves[k - 2], waits.save_s));
    start_load(k + 1);
    return absl::OkStatus();
  };
  start_load(0);
  absl::Status result;
  size_t k = 0;
  for (; k < tiles.size(); ++k) {
    result = wait_for(loads[k], waits.load_s);
    if (!result.ok()) break;
    // The next tile loads while this one is used: ask for the next shard
    // now if this is the last tile known.
    if (k + 1 < tiles.size() || pull(/*wait=*/false)) {
      result = load_next(k);
      if (!result.ok()) break;
    }
    result = fn(tiles[k].shard, StagingTile(k % 3, tiles[k]));
    if (!result.ok()) break;
    if (write_back) {
      saves[k] = std::async(std::launch::async, [this, k, ref = tiles[k]] { return Save(k % 3, ref); });
    }
    // None was ready: wait for one (this tile's save runs meanwhile).
    if (k + 1 == tiles.size() && pull(/*wait=*/true)) {
      result = load_next(k);
      if (!result.ok()) break;
    }
  }
  drop_unclaimed();
  // Drain everything still running before the staging sets can be reused.
  for (size_t i = 0; i < tiles.size(); ++i) {
    if (loads[i].valid()) {
      absl::Status s = loads[i].get();
      if (result.ok() && !s.ok() && i <= k) result = s;
    }
    if (saves[i].valid()) {
      absl::Status s = wait_for(saves[i], waits.save_s);
      if (result.ok() && !s.ok()) result = s;
    }
  }
  if (write_back) waits_ = waits;
  return result;
}

absl::Status NvmeShardStateStore::Update(const std::vector<ShardId>& shards, const TileFn& fn) {
  return Run(ShardList(shards), fn, /*write_back=*/true);
}

absl::Status NvmeShardStateStore::UpdateStream(const ShardSource& next, const TileFn& fn) {
  return Run(next, fn, /*write_back=*/true);
}

absl::Status NvmeShardStateStore::Read(const std::vector<ShardId>& shards, const TileFn& fn) {
  return Run(ShardList(shards), fn, /*write_back=*/false);
}

uint64_t NvmeShardStateStore::bytes() const {
  uint64_t total = 0;
  for (const auto& [key, numel] : numel_) total += numel * 4 * Streams().size();
  return total;
}

}  // namespace strata
