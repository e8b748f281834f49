// ParamCache: ZeRO-Infinity's params. Each rank's param shards live on NVMe
// (their home, in the extent store) and are brought into the rank's exchange
// region -- shared memory the trainer reads -- when the trainer acquires them,
// or earlier, when the prefetcher predicts the access.
//
// Residency is bounded by a byte budget per job; a resident shard that is not
// pinned may be dropped (it is a clean copy of its home), the one whose
// predicted next use is farthest first. A dropped shard's slot is handed to
// the Discard callback, which gives its memory back to the OS (the job's
// window, tiers/pinned_arena.h), so the budget bounds memory, not just which
// slots are current. The budget is shared with bytes the cache does not own
// (the job's gradients in their slots, SetReserved): params get what is left. Predictions come from prefetch/'s
// TracePredictor, one per rank: it learns the iteration's access order,
// follows it through small deviations and relearns when the order changes.
//
// Thread-safe. Reads run on the daemon's worker pool (shared by every job),
// one at a time per cache and one per turn, never under the cache's lock.
#ifndef STRATA_DAEMON_PARAM_CACHE_H_
#define STRATA_DAEMON_PARAM_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/shard_key.h"
#include "prefetch/trace_predictor.h"
#include "tiers/transfer_executor.h"

namespace strata {

class ExtentStore;

struct ParamCacheStats {
  uint64_t hits = 0;          // acquired while resident
  uint64_t misses = 0;        // acquired while absent: the trainer waited for a read
  uint64_t waits_in_flight = 0;  // acquired while a prefetch was still reading
  uint64_t prefetches = 0;
  uint64_t prefetches_unused = 0;  // dropped before any acquire
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  double stall_s = 0;          // time Acquire waited
};

class ParamCache {
 public:
  // `slot(rank, index)` is where shard (rank, index) lives in shared memory
  // (4 KiB-aligned, `padded bytes` long); `home_key` names its NVMe home.
  struct ShardRef {
    std::byte* slot = nullptr;
    uint64_t bytes = 0;
  };
  using Locate = std::function<ShardRef(uint32_t rank, uint32_t index)>;
  // Called (under the cache's lock: it must be quick and take no lock but
  // leaf ones) when shard (rank, index) stops being resident: its slot's
  // contents are no longer needed.
  using Discard = std::function<void(uint32_t rank, uint32_t index)>;

  // `store` is shared with other jobs (it is safe for concurrent use);
  // reads run on `workers`, which must outlive the cache.
  ParamCache(uint64_t job_id, uint32_t ranks, ExtentStore* store, Locate locate, uint64_t budget_bytes,
             uint32_t lookahead, TransferExecutor* workers, Discard discard = nullptr);
  ~ParamCache();

  // Writes the current contents of the rank's slot `index` to NVMe as the new
  // home version; the slot stays resident (clean).
  absl::Status StoreHome(uint32_t rank, uint32_t index);
  // Reads the NVMe home of shard (rank, index) -- the params as of the last
  // step, whatever is resident -- into `into` (aligned, at least the slot's
  // padded bytes). A restored job's slots start empty; its homes do not.
  absl::Status ReadHome(uint32_t rank, uint32_t index, absl::Span<std::byte> into) const;
  // Makes the slots current and pins them. Waits for reads until `deadline`.
  absl::Status Acquire(uint32_t rank, absl::Span<const uint32_t> indices, absl::Time deadline);
  absl::Status Release(uint32_t rank, absl::Span<const uint32_t> indices);
  void ReleaseAll(uint32_t rank);
  void IterationBoundary(uint32_t rank);
  // Brackets an optimizer step, which rewrites every param slot: BeginUpdate
  // drops queued prefetches and waits for reads in flight (a read landing
  // after the step wrote a slot would put the old params back); no read
  // starts until EndUpdate, which resumes prefetching.
  void BeginUpdate();
  void EndUpdate();
  // `bytes` of the budget are taken by others (the job's gradients): drops
  // unpinned shards of any rank, farthest next use first, until the params
  // fit in what is left, and keeps later reads within it. Returns the
  // params' resident bytes afterwards (more than what is left when pinned
  // shards alone exceed it).
  uint64_t SetReserved(uint64_t bytes);
  // Marks shard (rank, index) absent and discards its slot, unless it is
  // pinned or being read (then false). An optimizer step uses it for a slot
  // it wrote and stored home that the budget has no room for.
  bool Drop(uint32_t rank, uint32_t index);
  uint64_t resident_bytes() const;
  uint64_t budget_bytes() const { return budget_bytes_; }
  ParamCacheStats stats() const;

 private:
  enum class State : uint8_t { kAbsent, kReading, kResident };
  struct Entry {
    State state = State::kAbsent;
    int pins = 0;
    bool prefetched_unused = false;
    uint64_t bytes = 0;
    absl::Status read_error;
  };
  struct RankTrace {
    TracePredictor predictor;
    std::vector<ShardKey> current;   // this iteration's accesses so far
    std::vector<ShardKey> previous;  // the last iteration's
  };
  ShardKey KeyOf(uint32_t rank, uint32_t index) const;

  // Queues a read turn on the pool when reads wait and none is queued or
  // running; a turn does one read and queues the next behind other work.
  void ScheduleReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReadTurn();
  void StartReadLocked(uint32_t rank, uint32_t index, bool prefetch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts unpinned resident shards of `rank` (of every rank when `rank` is
  // kAnyRank) until `bytes` more fit beside the reserved bytes.
  static constexpr uint32_t kAnyRank = UINT32_MAX;
  bool MakeRoomLocked(uint32_t rank, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictLocked(std::pair<uint32_t, uint32_t> key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PrefetchLocked(uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double DistanceLocked(uint32_t rank, uint32_t index) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t job_id_;
  ExtentStore* const store_;
  const Locate locate_;
  const uint64_t budget_bytes_;
  const uint32_t lookahead_;
  const Discard discard_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<RankTrace> traces_ ABSL_GUARDED_BY(mu_);
  uint64_t resident_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // see SetReserved
  std::deque<std::pair<uint32_t, uint32_t>> reads_ ABSL_GUARDED_BY(mu_);
  ParamCacheStats stats_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool updating_ ABSL_GUARDED_BY(mu_) = false;
  int reads_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  TransferExecutor* const workers_;
  bool read_scheduled_ ABSL_GUARDED_BY(mu_) = false;  // a read turn is queued or running
};

}  // namespace strata

#endif  // STRATA_DAEMON_PARAM_CACHE_H_
