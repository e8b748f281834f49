// HostShardStateStore: ZeRO-Offload's states in host memory, one block per
// shard holding master | exp_avg | exp_avg_sq | max_exp_avg_sq as the
// optimizer needs them. Each block is populated when created, so no
// first-touch fault lands in a step.
//
// Thread-safe for different shards; one shard is updated by one thread at a time.
#ifndef STRATA_DAEMON_HOST_SHARD_STATE_STORE_H_
#define STRATA_DAEMON_HOST_SHARD_STATE_STORE_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "daemon/shard_state_store.h"
#include "tiers/pinned_arena.h"

namespace strata {

class HostShardStateStore final : public ShardStateStore {
 public:
  explicit HostShardStateStore(const StateLayout& layout) : layout_(layout) {}

  absl::Status Create(uint32_t rank, uint32_t index, uint64_t numel) override;
  absl::Status Adopt(uint32_t, uint32_t, uint64_t) override {
    return absl::UnimplementedError("offload states live in host memory and do not survive a restart");
  }
  absl::Status Update(const std::vector<ShardId>& shards, const TileFn& fn) override;
  absl::Status Read(const std::vector<ShardId>& shards, const TileFn& fn) override;
  uint64_t bytes() const override;

 private:
  struct Block {
    PinnedArena arena;
    uint64_t numel = 0;
  };
  absl::StatusOr<StateTile> TileOf(uint32_t rank, uint32_t index);

  const StateLayout layout_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, std::unique_ptr<Block>> blocks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_DAEMON_HOST_SHARD_STATE_STORE_H_
