#include "daemon/host_shard_state_store.h"

#include "absl/strings/str_cat.h"

namespace strata {

absl::Status HostShardStateStore::Create(uint32_t rank, uint32_t index, uint64_t numel) {
  const uint64_t streams = 1 + layout_.exp_avg + layout_.exp_avg_sq + layout_.max_exp_avg_sq;
  PinnedArenaOptions options;
  options.name = absl::StrCat("strata-states-r", rank, "-s", index);
  options.size_bytes = std::max<uint64_t>((streams * numel * 4 + 4095) / 4096 * 4096, 4096);
  auto arena = PinnedArena::Create(options);
  if (!arena.ok()) {
    return absl::Status(arena.status().code(), absl::StrCat("allocating optimizer states for rank ", rank,
                                                            " shard ", index, ": ", arena.status().message()));
  }
  auto block = std::make_unique<Block>();
  block->arena = std::move(*arena);
  block->numel = numel;
  absl::MutexLock lock(&mu_);
  blocks_[{rank, index}] = std::move(block);
  return absl::OkStatus();
}

absl::StatusOr<StateTile> HostShardStateStore::TileOf(uint32_t rank, uint32_t index) {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find({rank, index});
  if (it == blocks_.end()) {
    return absl::NotFoundError(absl::StrCat("no optimizer states for rank ", rank, " shard ", index));
  }
  Block& b = *it->second;
  float* base = reinterpret_cast<float*>(b.arena.data());
  StateTile tile;
  tile.size = b.numel;
  tile.master = base;
  float* next = base + b.numel;
  if (layout_.exp_avg) { tile.exp_avg = next; next += b.numel; }
  if (layout_.exp_avg_sq) { tile.exp_avg_sq = next; next += b.numel; }
  if (layout_.max_exp_avg_sq) { tile.max_exp_avg_sq = next; }
  return tile;
}

absl::Status HostShardStateStore::Update(const std::vector<ShardId>& shards, const TileFn& fn) {
  for (const ShardId& id : shards) {
    auto tile = TileOf(id.rank, id.index);
    if (!tile.ok()) return tile.status();
    if (absl::Status s = fn(id, *tile); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status HostShardStateStore::Read(const std::vector<ShardId>& shards, const TileFn& fn) {
  return Update(shards, fn);
}

uint64_t HostShardStateStore::bytes() const {
  absl::MutexLock lock(&mu_);
  uint64_t total = 0;
  for (const auto& [key, block] : blocks_) total += block->arena.size_bytes();
  return total;
}

}  // namespace strata
