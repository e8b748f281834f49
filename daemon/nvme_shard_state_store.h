// NvmeShardStateStore: ZeRO-Infinity's fp32 masters and optimizer states on
// NVMe (the extent store), streamed through three sets of pinned staging
// tiles: while the optimizer updates tile k, tile k+1 is read and tile k-1 is
// written back. Staging is 3 x streams x min(tile, largest shard) bytes,
// whatever the size of a sub-group (DeepSpeed sizes it by the largest sub-group times its buffer
// count, its users' most common NVMe out-of-memory).
//
// Each tile of each stream is one extent-store shard:
// ShardKey{job, rank, tensor = shard index, kind = stream, index = tile}.
//
// Thread-compatible: one Update at a time (the job's worker calls it). The
// extent store is shared with other jobs and safe for concurrent use; this
// job's tile loads and saves run on its I/O lanes at once.
#ifndef STRATA_DAEMON_NVME_SHARD_STATE_STORE_H_
#define STRATA_DAEMON_NVME_SHARD_STATE_STORE_H_

#include <future>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "core/shard_key.h"
#include "daemon/shard_state_store.h"
#include "swap/aligned_buffer.h"

namespace strata {

class ExtentStore;

class NvmeShardStateStore final : public ShardStateStore {
 public:
  static absl::StatusOr<std::unique_ptr<NvmeShardStateStore>> Create(
      uint64_t job_id, const StateLayout& layout, ExtentStore* store, uint64_t tile_bytes);

  absl::Status Create(uint32_t rank, uint32_t index, uint64_t numel) override;
  absl::Status Adopt(uint32_t rank, uint32_t index, uint64_t numel) override;
  absl::Status Update(const std::vector<ShardId>& shards, const TileFn& fn) override;
  // One pass however many shards `next` gives: tile k+1 loads while `fn` is
  // on tile k and tile k-1 saves, across shards; only when `next` has none
  // ready does the pass wait for it (the last tile's save runs meanwhile) and
  // the next shard's first load go unoverlapped.
  absl::Status UpdateStream(const ShardSource& next, const TileFn& fn) override;
  absl::Status Read(const std::vector<ShardId>& shards, const TileFn& fn) override;
  // Loads the first three tiles into the three staging sets (tile k into set
  // k, as Update would), unless loads started so are still unclaimed.
  void Preload(const std::vector<ShardId>& shards) override;
  uint64_t bytes() const override;
  StateStaging staging() const override { return StateStaging{tile_elements_ * 4, staging_.size()}; }
  UpdateWaits last_update_waits() const override { return waits_; }

 private:
  struct TileRef {
    ShardId shard;
    uint32_t tile = 0;
    uint64_t offset = 0;  // elements
    uint64_t size = 0;
    friend bool operator==(const TileRef&, const TileRef&) = default;
  };
  NvmeShardStateStore(uint64_t job_id, const StateLayout& layout, ExtentStore* store,
                      uint64_t tile_elements);
  // Grows the staging to hold a tile of a shard of `numel` elements.
  absl::Status EnsureStaging(uint64_t numel);
  std::vector<TileRef> Tiles(const std::vector<ShardId>& shards) const;
  StateTile StagingTile(int set, const TileRef& ref);
  absl::Status Load(int set, const TileRef& ref);
  absl::Status Save(int set, const TileRef& ref);
  absl::Status Run(const ShardSource& next, const TileFn& fn, bool write_back);
  std::vector<TensorKind> Streams() const;

  const uint64_t job_id_;
  const StateLayout layout_;
  ExtentStore* const store_;
  const uint64_t tile_elements_;
  uint64_t stage_elements_ = 0;  // per stream and set in staging_: min(tile, largest shard)
  // 3 sets x streams x tile, on transparent huge pages: private to the
  // daemon (no need for a shareable memfd, whose shmem pages are 4 KiB here),
  // and a 1 MiB O_DIRECT request on 2 MiB pages is one DMA segment, which
  // doubled read throughput on virtio disks (docs/SWAP.md).
  AlignedBuffer staging_;
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, uint64_t> numel_;  // per shard
  UpdateWaits waits_;  // of the last Run (one Run at a time: see above)
  // Tile k of the next Run, loading into set k since Preload (between Runs:
  // Preload, Run, Create and Adopt are serialized by the job; the mutex is
  // for the hand-over). Declared last: destroyed (waited for) first.
  struct Preloaded {
    TileRef ref;
    std::future<absl::Status> load;
  };
  // Waits for the preloads not taken and forgets them (the staging is about
  // to be reused or reallocated).
  void DropPreloads();
  absl::Mutex preload_mu_;
  std::vector<Preloaded> preloaded_ ABSL_GUARDED_BY(preload_mu_);
};

}  // namespace strata

#endif  // STRATA_DAEMON_NVME_SHARD_STATE_STORE_H_
