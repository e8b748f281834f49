// ParamStore: the daemon's one TieredStore for ZeRO-Infinity params, shared
// by every job: the device tier (JobServices::device, when the daemon has
// one), the pinned tier made of the jobs' exchange windows (WindowTier), and
// the home tier on NVMe (NvmeTier over the daemon's ExtentStore, keeping
// extents when slots are freed so homes outlive a job's slots and a daemon
// restart). Transfers run on the store's own small pool, so a job's turn on
// the daemon's worker pool may wait for one without deadlocking the pool.
//
// Eviction: JobRoutedPolicy hands each job's candidates to the policy that
// job registered (ParamCache: FarthestNextUsePolicy over its ranks' trace
// predictors and its PredictionTrust): a job evicts its own shards first;
// another job's copies go only on a demand miss when the tier itself is full
// (least recently used first), never for a prefetch.
//
// Optimizer states stream outside this store (docs/ARCHITECTURE.md).
//
// Thread-safe.
#ifndef STRATA_DAEMON_PARAM_STORE_H_
#define STRATA_DAEMON_PARAM_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/clock.h"
#include "daemon/window_tier.h"
#include "swap/extent_store.h"
#include "tiers/eviction_policy.h"
#include "tiers/nvme_tier.h"
#include "tiers/tiered_store.h"
#include "tiers/transfer_executor.h"

namespace strata {

// Routes an eviction to the policy of the job the room is for.
class JobRoutedPolicy final : public EvictionPolicy {
 public:
  // `policy` is borrowed until Unregister.
  void Register(JobId job, EvictionPolicy* policy);
  void Unregister(JobId job);
  std::optional<size_t> ChooseVictim(const EvictionRequest& request,
                                     absl::Span<const EvictionCandidate> candidates) override;

 private:
  absl::Mutex mu_;  // a leaf: taken under the store's lock
  absl::flat_hash_map<JobId, EvictionPolicy*> policies_ ABSL_GUARDED_BY(mu_);
  LruPolicy lru_;
};

struct ParamStoreOptions {
  // The pinned tier's capacity (the daemon's pinned capacity; 0: unbounded).
  uint64_t pinned_capacity_bytes = 0;
  // Threads moving shards between tiers; 0: none, each transfer runs in the
  // thread that asks for it (a store private to one job, which must not add
  // threads to the daemon: prefetches then read inline in Acquire).
  int io_threads = 4;
};

class ParamStore {
 public:
  // `nvme` (required) and `device` (optional) are borrowed and outlive it.
  static absl::StatusOr<std::unique_ptr<ParamStore>> Create(ExtentStore* nvme, Tier* device,
                                                            const ParamStoreOptions& options);
  ~ParamStore();

  TieredStore* store() const { return store_.get(); }
  WindowTier* windows() const { return windows_.get(); }
  JobRoutedPolicy* policies() { return &policy_; }
  ExtentStore* nvme() const { return nvme_; }
  bool has_device() const { return store_->has_tier(TierKind::kDevice); }

 private:
  ParamStore() = default;
  ExtentStore* nvme_ = nullptr;
  RealClock clock_;
  JobRoutedPolicy policy_;
  std::unique_ptr<TransferExecutor> io_;
  std::unique_ptr<WindowTier> windows_;
  std::unique_ptr<NvmeTier> home_;
  std::unique_ptr<TieredStore> store_;  // last: destroyed first
};

}  // namespace strata

#endif  // STRATA_DAEMON_PARAM_STORE_H_
