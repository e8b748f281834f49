// ParamCache: one job's view of the daemon's param store (daemon/param_store.h,
// one TieredStore for every job). Each rank's param shards have their home on
// NVMe (in the extent store) and are cached in the rank's exchange window --
// the shard's fixed slot there, shared memory the trainer reads -- when the
// trainer acquires them, or earlier, when the job's predictor says they come
// next; a job with a device budget also gets copies in the daemon's device
// arena (AcquireDevice).
//
// Residency in the window is bounded by the job's budget (the store's per-job
// budget of the pinned tier); the budget is shared with bytes the cache does
// not own (the job's gradients in their slots, SetReserved): params get what
// is left, which is kept by trimming the job's clean copies (Trim) and by
// making prefetches fit. A dropped copy's slot goes back to the OS
// (WindowTier::Free punches it out of the window). Eviction and trimming go by
// FarthestNextUsePolicy over the job's predictor -- one TracePredictor per
// rank, which learns the iteration's access order, follows it through small
// deviations and relearns when it changes -- gated by the job's
// PredictionTrust: while the prediction loses to recency on this job's own
// accesses, eviction is by recency and nothing is prefetched.
//
// Either over the daemon's shared ParamStore, or (the second constructor, for
// tests and tools) over a private one on `store`.
//
// Thread-safe. The data moves on the store's transfer threads, never under
// the cache's lock.
#ifndef STRATA_DAEMON_PARAM_CACHE_H_
#define STRATA_DAEMON_PARAM_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/shard_key.h"
#include "core/tier_kind.h"
#include "tiers/tiered_store.h"
#include "tiers/transfer_executor.h"

namespace strata {

class ExtentStore;
class ParamStore;
class PredictionTrust;
class FarthestNextUsePolicy;

// One tier's share of a job's param acquires: the window (Acquire) or the
// device tier (AcquireDevice). Hits and misses are judged when the trainer
// asks, before the cache promotes what is missing; the store's own
// acquire_hits cannot say that, as its Acquire comes after the promotion.
struct ParamTierStats {
  uint64_t bytes = 0;           // what the job's copies in the tier take now
  uint64_t hits = 0;            // acquired while resident in the tier
  uint64_t misses = 0;          // acquired while absent: the trainer waited for a copy
  uint64_t waits_in_flight = 0;  // acquired while a prefetch into the tier was still moving
  double stall_s = 0;           // time those acquires waited
  uint64_t prefetches = 0;      // prefetches into the tier
  uint64_t prefetches_unused = 0;  // of them, dropped there before any acquire
};

// The job-wide fields sum the tiers' (`window` and `device`).
struct ParamCacheStats {
  uint64_t hits = 0;          // acquired while resident
  uint64_t misses = 0;        // acquired while absent: the trainer waited for a read
  uint64_t waits_in_flight = 0;  // acquired while a prefetch was still reading
  uint64_t prefetches = 0;
  uint64_t prefetches_unused = 0;  // dropped before any acquire
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
  double stall_s = 0;          // time Acquire waited
  ParamTierStats window;       // the pinned exchange windows
  ParamTierStats device;       // the job's device arena
};

// What Park or Resume did to the job's shards.
struct ParamMove {
  TierKind top = TierKind::kNvme;  // the fastest tier a shard is in afterwards
  uint64_t shards = 0;       // shards that had copies moved or dropped
  uint64_t bytes_moved = 0;  // bytes copied between tiers
  double seconds = 0;
};

class ParamCache {
 public:
  // `slot(rank, index)` is where shard (rank, index) lives in shared memory
  // (4 KiB-aligned, `padded bytes` long, at `offset` in the rank's window).
  struct ShardRef {
    std::byte* slot = nullptr;
    uint64_t bytes = 0;
    uint64_t offset = 0;
  };
  using Locate = std::function<ShardRef(uint32_t rank, uint32_t index)>;
  // Called (under the store's lock: it must be quick and take no lock but
  // leaf ones) when shard (rank, index) stops being resident in the window:
  // its slot's contents are no longer needed.
  using Discard = std::function<void(uint32_t rank, uint32_t index)>;

  // Over the daemon's store, which outlives the cache.
  ParamCache(uint64_t job_id, uint32_t ranks, ParamStore* params, Locate locate, uint64_t budget_bytes,
             uint32_t lookahead, Discard discard);
  // Over a store of its own on `store` (shared with other users; safe for
  // concurrent use). `workers` is not used any more (the store moves data on
  // its own threads); kept for callers of the earlier interface.
  ParamCache(uint64_t job_id, uint32_t ranks, ExtentStore* store, Locate locate, uint64_t budget_bytes,
             uint32_t lookahead, TransferExecutor* workers, Discard discard = nullptr);
  ~ParamCache();

  // Writes the current contents of the rank's slot `index` to NVMe as the new
  // home version; the slot stays resident (clean), within the budget.
  absl::Status StoreHome(uint32_t rank, uint32_t index);
  // As StoreHome, for new params the step wrote into memory of its own
  // (`params`, the slot's padded bytes, aligned for the NVMe store): when the
  // window has room for them beside what it holds (the budget less the
  // gradients), they are copied into the slot and stored as StoreHome does,
  // for the next forward; otherwise they go home straight from `params`
  // (TieredStore::WriteHome) and the slot stays out of memory -- no page of
  // it is faulted in, written and punched out again (19 + 5 ms per 20 MB
  // shard on the test machine, most of the step's optimizer and params-home
  // time at 800M, docs/DAEMON.md). Only between BeginUpdate and EndUpdate.
  absl::Status StoreHomeFrom(uint32_t rank, uint32_t index, absl::Span<const std::byte> params);
  // The new params of shard (rank, index), which the caller wrote to NVMe
  // under `pending` (a key of the job's own, since the job's last commit),
  // become the home's new version without being moved (ExtentStore::Rename)
  // and the cached copies are dropped: for params stepped before the step
  // started (InfinityPipeline), stored once, not kept in memory meanwhile.
  // FailedPrecondition, changing nothing, when a copy is pinned or moving or
  // `pending` was committed (the caller then reads it back and uses
  // StoreHomeFrom); InvalidArgument when its size is not the slot's. Only
  // between BeginUpdate and EndUpdate.
  absl::Status InstallHome(uint32_t rank, uint32_t index, const ShardKey& pending);
  // Reads the NVMe home of shard (rank, index) -- the params as of the last
  // step, whatever is resident -- into `into` (aligned, at least the slot's
  // padded bytes). A restored job's slots start empty; its homes do not.
  absl::Status ReadHome(uint32_t rank, uint32_t index, absl::Span<std::byte> into) const;
  // Makes the slots current and pins them. Waits for reads until `deadline`.
  absl::Status Acquire(uint32_t rank, absl::Span<const uint32_t> indices, absl::Time deadline);
  // Brings the shards into the device tier and pins them there; returns
  // each one's offset in the device arena. FailedPrecondition when the store
  // has no device tier or the job no device budget (SetDeviceBudget).
  absl::StatusOr<std::vector<uint64_t>> AcquireDevice(uint32_t rank, absl::Span<const uint32_t> indices,
                                                      absl::Time deadline);
  // The job's budget in the device tier (0: none; device acquires refused).
  absl::Status SetDeviceBudget(uint64_t bytes);
  bool has_device_tier() const;
  // Unpins one acquire of each shard (window or device).
  absl::Status Release(uint32_t rank, absl::Span<const uint32_t> indices);
  void ReleaseAll(uint32_t rank);
  void IterationBoundary(uint32_t rank);
  // Brackets an optimizer step, which rewrites every param slot: BeginUpdate
  // stops prefetching and waits for the cache's transfers in flight (a read
  // landing after the step wrote a slot would put the old params back);
  // Acquire waits until EndUpdate, which resumes prefetching.
  void BeginUpdate();
  void EndUpdate();
  // `bytes` of the budget are taken by others (the job's gradients): drops
  // unpinned shards of any rank, farthest next use first, until the params
  // fit in what is left, and keeps prefetches within it. Returns the
  // params' resident bytes afterwards (more than what is left when pinned
  // shards alone exceed it). During an update the drop waits for StoreHome.
  uint64_t SetReserved(uint64_t bytes);
  // Marks shard (rank, index) absent in the window and discards its slot,
  // unless it is pinned or being read (then false).
  bool Drop(uint32_t rank, uint32_t index);
  // Pushes every shard of the job down to `to` (kPinnedHost or kNvme),
  // freeing the faster tiers' slots; remembers what was resident above so
  // Resume brings it back. FailedPrecondition naming the rank when a shard
  // is pinned.
  absl::StatusOr<ParamMove> Park(TierKind to);
  absl::StatusOr<ParamMove> Resume();
  // Takes the job's shards out of the store (its window slots are freed);
  // every later call fails. For a job replaced by a reloaded copy of itself.
  void Detach();
  uint64_t resident_bytes() const;
  uint64_t budget_bytes() const { return budget_bytes_; }
  ParamCacheStats stats() const;

  class Predictor;  // the job's AccessPredictor over its ranks' traces

 private:
  using Index = std::pair<uint32_t, uint32_t>;
  // Ends a call's issuing of promotions (see BeginUpdate).
  struct IssueEnd {
    ParamCache* cache;
    ~IssueEnd();
  };
  void Init(ParamStore* params);
  ShardKey KeyOf(uint32_t rank, uint32_t index) const;
  // Adds the shard to the store (adopting its NVMe home) on first use.
  absl::Status EnsureShard(uint32_t rank, uint32_t index);
  // Pins shards in `tier`, waiting for their promotions until `deadline`.
  absl::StatusOr<std::vector<Lease>> AcquireIn(uint32_t rank, absl::Span<const uint32_t> indices,
                                               TierKind tier, absl::Time deadline);
  // Waits (until `deadline`) for the cache's transfers in flight, whose
  // copies a demand promotion could not evict while they moved. Returns
  // whether any was waited for.
  bool WaitForTransfers(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);
  // Records `rank`'s accesses and asks the store for what comes next.
  void Prefetch(uint32_t rank) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Usable() const ABSL_LOCKS_EXCLUDED(mu_);
  void TrimToBudget() ABSL_LOCKS_EXCLUDED(mu_);
  // The budget left to params: the job's budget less what others reserved.
  uint64_t ParamRoomLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return budget_bytes_ > reserved_bytes_ ? budget_bytes_ - reserved_bytes_ : 0;
  }

  const uint64_t job_id_;
  const uint32_t ranks_;
  const Locate locate_;
  const uint64_t budget_bytes_;
  const uint32_t lookahead_;
  const Discard discard_;
  std::unique_ptr<ParamStore> owned_;  // the second constructor's
  ParamStore* params_ = nullptr;
  TieredStore* store_ = nullptr;
  ExtentStore* nvme_ = nullptr;
  absl::Status init_status_;
  std::unique_ptr<Predictor> predictor_;
  std::unique_ptr<PredictionTrust> trust_;  // set once, before the policy is registered
  std::unique_ptr<FarthestNextUsePolicy> policy_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  absl::flat_hash_set<Index> known_ ABSL_GUARDED_BY(mu_);  // in the store
  absl::flat_hash_map<Index, std::vector<LeaseId>> leases_ ABSL_GUARDED_BY(mu_);
  std::vector<TransferHandle> in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<TierKind> prefetch_tier_ ABSL_GUARDED_BY(mu_);  // per rank: where it acquires
  std::vector<std::pair<ShardKey, TierKind>> parked_ ABSL_GUARDED_BY(mu_);
  uint64_t reserved_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t device_budget_ ABSL_GUARDED_BY(mu_) = 0;
  bool updating_ ABSL_GUARDED_BY(mu_) = false;
  int issuing_ ABSL_GUARDED_BY(mu_) = 0;  // calls asking the store for promotions now
  bool detached_ ABSL_GUARDED_BY(mu_) = false;
  // Hits, misses, waits and stall of the window's acquires and the device's.
  ParamTierStats window_stats_ ABSL_GUARDED_BY(mu_);
  ParamTierStats device_stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_DAEMON_PARAM_CACHE_H_
