// ShardStateStore: where a job's fp32 master params and optimizer states
// live. Two implementations: HostShardStateStore (ZeRO-Offload: pinned host
// memory) and NvmeShardStateStore (ZeRO-Infinity: the NVMe extent store,
// streamed through pinned staging tiles).
#ifndef STRATA_DAEMON_SHARD_STATE_STORE_H_
#define STRATA_DAEMON_SHARD_STATE_STORE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "optimizer_cpu/hyperparams.h"

namespace strata {

// One tile of a shard's states; null where the optimizer keeps no such state.
struct StateTile {
  uint64_t offset = 0;  // first element of the tile within the shard
  uint64_t size = 0;    // elements
  float* master = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  float* max_exp_avg_sq = nullptr;
};

struct ShardId {
  uint32_t rank = 0;
  uint32_t index = 0;
  friend bool operator==(const ShardId&, const ShardId&) = default;
};

using TileFn = std::function<absl::Status(const ShardId&, const StateTile&)>;

// The shards of a streaming Update, one at a time: with `wait` false it
// answers at once (nullopt: none is ready yet); with `wait` true it may block
// until one is, and nullopt ends the stream.
using ShardSource = std::function<std::optional<ShardId>(bool wait)>;

// The shards of a list, in order (`shards` must outlive the source).
inline ShardSource ShardList(const std::vector<ShardId>& shards) {
  return [&shards, i = size_t{0}](bool) mutable -> std::optional<ShardId> {
    if (i == shards.size()) return std::nullopt;
    return shards[i++];
  };
}

// The pinned staging a store streams the states through; zero for a store
// that holds them in memory. Exported to clients (JobInfo) so that tools such
// as bench/offload_parts measure the daemon's layout instead of re-deriving it.
struct StateStaging {
  uint64_t tile_bytes = 0;  // bytes of one state stream per tile: the unit of the NVMe layout
  uint64_t bytes = 0;       // the staging buffers in all (sets x streams x tile, less for small shards)
};

// How long the last Update blocked on its storage, in seconds.
struct UpdateWaits {
  double load_s = 0;  // waiting for a tile's load before `fn` could run on it
  double save_s = 0;  // waiting for a tile's save (its staging set's reuse, the final drain)
};

class ShardStateStore {
 public:
  virtual ~ShardStateStore() = default;

  // Creates the states of shard (rank, index) with `numel` elements, zeroed.
  virtual absl::Status Create(uint32_t rank, uint32_t index, uint64_t numel) = 0;

  // Takes over the states of shard (rank, index) that a previous run of the
  // daemon left in persistent storage. NotFound when they are not there;
  // Unimplemented for stores that do not outlive the daemon.
  virtual absl::Status Adopt(uint32_t rank, uint32_t index, uint64_t numel) = 0;

  // Calls `fn` on every tile of `shards`, in order, with the states loaded,
  // then persists what `fn` changed. An implementation that loads from slower
  // storage overlaps loading the next tile and saving the previous one with
  // `fn` on the current one. Stops at the first error.
  virtual absl::Status Update(const std::vector<ShardId>& shards, const TileFn& fn) = 0;

  // As Update, over the shards `next` gives while the pass runs: a pass can
  // start before its caller knows every shard it will visit (shards stepped
  // while the step's last gradients come in) and still overlap each tile's
  // load and save with its neighbours'. By default, one Update per shard.
  virtual absl::Status UpdateStream(const ShardSource& next, const TileFn& fn) {
    while (std::optional<ShardId> id = next(/*wait=*/true)) {
      if (absl::Status s = Update({*id}, fn); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // As Update, but nothing is written back.
  virtual absl::Status Read(const std::vector<ShardId>& shards, const TileFn& fn) = 0;

  // A hint that the next Update visits `shards` in this order: a store that
  // loads from slower storage may start loading the first tiles now (the
  // gradients of the step are still arriving). Loads only; the next Update
  // or Read takes them over or discards them. Nothing by default.
  virtual void Preload(const std::vector<ShardId>& /*shards*/) {}

  // Bytes the store holds, for stats.
  virtual uint64_t bytes() const = 0;

  virtual StateStaging staging() const { return {}; }

  // The waits of the last Update (zero for a store that keeps its states in
  // memory). Call from the thread that called Update, after it returned.
  virtual UpdateWaits last_update_waits() const { return {}; }
};

}  // namespace strata

#endif  // STRATA_DAEMON_SHARD_STATE_STORE_H_
