// InfinityPipeline: ZeRO-Infinity (docs/DAEMON.md). The fp32 masters and
// optimizer states stream from NVMe (NvmeShardStateStore) and every param
// shard has its home there; both are committed with the job's record each
// step. Each rank's region is a window within the job's pinned budget: a
// ParamCache keeps the params the trainers acquire, and a gradient that does
// not fit is written to NVMe (GradSpill) once inspected and read back, in
// step order, when the step needs it. Without clipping, a shard whose
// gradient is inspected while others are still coming in is stepped then
// (EarlyStepLocked): its new params wait on NVMe under a key of their own,
// its slot is freed at once, and the step's start renames them onto the
// shard's home.
#ifndef STRATA_DAEMON_INFINITY_PIPELINE_H_
#define STRATA_DAEMON_INFINITY_PIPELINE_H_

#include <future>
#include <string>
#include <utility>

#include "daemon/grad_spill.h"
#include "daemon/param_cache.h"
#include "daemon/pinned_budget.h"
#include "daemon/step_pipeline.h"
#include "swap/aligned_buffer.h"

namespace strata {

class ExtentStore;

class InfinityPipeline final : public StepPipeline {
 public:
  // `nvme` is required; `pinned` may be null (unlimited); `params` is the
  // daemon's param store (null: the job's ParamCache keeps one of its own).
  InfinityPipeline(uint64_t job_id, std::string job_name, uint32_t world_size, SlotDTypes dtypes,
                   uint64_t pinned_budget_bytes, ExtentStore* nvme, PinnedBudget* pinned,
                   ParamStore* params = nullptr, bool early_apply = false);
  ~InfinityPipeline() override;

  bool durable() const override { return true; }
  bool early_apply() const override { return early_apply_; }
  bool windowed() const override { return true; }

  absl::StatusOr<std::unique_ptr<ShardStateStore>> MakeStates(const StateLayout& layout,
                                                              uint64_t tile_bytes) override;
  absl::StatusOr<uint64_t> RankPinnedBytes(uint32_t rank, const ExchangeLayout& layout,
                                           const StateLayout& states) const override;
  absl::Status OpenWindow(const std::vector<const std::vector<ExchangeSlot>*>& built, ExchangeRegions* regions,
                          TransferExecutor* workers, std::function<void()> rollback) override;
  void AddRankLocked(absl::Mutex& job_mu, uint32_t rank, uint32_t world, size_t shards) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu);
  void DropRankLocked(absl::Mutex& job_mu, uint32_t rank) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu);
  void CloseWindow() override;
  void ReleasePinned() override;
  uint64_t pinned_bytes() const override;
  void CountLocked(absl::Mutex& job_mu, JobCounters& counters) const override ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu);
  ParamCacheStats param_stats() const override;
  ParamCache* params() override { return param_cache_.get(); }

  absl::Status ParamsWritten(uint32_t rank, uint32_t index) override;
  absl::Status ParamsInitialized(uint32_t rank, uint32_t index) override;
  uint64_t InitBatchBytes() const override { return init_batch_bytes_; }
  absl::StatusOr<const std::byte*> ParamsToSave(uint32_t rank, const ExchangeSlot& slot, const std::byte* in_slot,
                                                std::optional<AlignedBuffer>& scratch) const override;
  absl::Status Acquire(uint32_t rank, const std::vector<uint32_t>& indices, absl::Time deadline) override;
  absl::Status Release(uint32_t rank, const std::vector<uint32_t>& indices) override;
  void IterationBoundary(uint32_t rank) override;
  void DropPins(uint32_t rank) override;

  void GradArrivedLocked(absl::Mutex& job_mu, uint32_t rank, uint32_t index, const ExchangeSlot& slot) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu);
  // Keeps params + gradients in the window's budget, evicting clean params
  // first and spilling this gradient to NVMe when that is not enough
  // (job_mu is released while it is written).
  absl::Status AfterInspectLocked(absl::Mutex& job_mu, uint32_t rank, uint32_t index,
                                  const ExchangeSlot& slot) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu);
  // room = the window budget / world size (at least two of the largest
  // gradient slot), keep = room - the largest gradient slot: a rank holding
  // more than keep after an inspection spills that gradient, so a trainer
  // that waits for room (RankSession::WaitGradRoom) always gets it.
  GradWindow GradWindowLocked(absl::Mutex& job_mu, uint32_t rank) const override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu);
  // A gradient still in its slot is stepped now (Job::RunEarlySteps: in one
  // pass with the others inspected meanwhile): its new params are written to
  // NVMe under a key of their own (SteppedKey) and its slot is freed at once;
  // no param slot, home or cached copy changes until the step starts, so a
  // trainer still acquiring params for backward, the prefetcher and an
  // overflow's rollback (which drops the uncommitted writes) find them as
  // they were. A spilled gradient waits for the step.
  //
  // With `step_certain` (the pass's rest, after the last gradient) the new
  // params are stored the way the step's own pass stores them (StoreHomeFrom:
  // home, and kept in the window within the budget), inside the param
  // cache's update, which the first such shard begins (renaming the pending
  // params of the shards stepped before it first) and the step ends.
  std::optional<StepHooks> EarlyStepLocked(absl::Mutex& job_mu, uint32_t rank, uint32_t index,
                                           const ExchangeSlot& slot, bool step_certain) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu);
  // Waits for the pass's last pending-params write (see early_write_); a
  // failed pass also ends the param cache's update if it began one.
  absl::Status EndEarlyPass(bool failed) override;
  StepHooks BeginStep(absl::Mutex& job_mu, const std::vector<ShardId>& ids,
                      const std::vector<std::vector<ExchangeSlot>>& slots) override ABSL_LOCKS_EXCLUDED(job_mu);
  void EndStep(absl::Mutex& job_mu) override ABSL_LOCKS_EXCLUDED(job_mu);
  void SkipStep(absl::Mutex& job_mu) override ABSL_LOCKS_EXCLUDED(job_mu);

 private:
  // Where a shard's gradient of the open step is (kStepped: the shard was
  // taken by an early pass, its new params go to NVMe under SteppedKey and
  // its slot is freed once it is stepped; kStoring: taken once the step was
  // certain, its params go home as the step's own pass stores them, and its
  // slot is freed then too).
  enum GradAt : uint8_t { kNowhere, kInSlot, kSpilled, kStepped, kStoring };
  // An early-stepped shard's new params until the step starts: the home's
  // key with index 1 (never committed: renamed onto the home or dropped).
  static ShardKey SteppedKey(uint64_t job_id, uint32_t rank, uint32_t index);
  // Step start: the params of the shards stepped early become their homes'
  // new versions (ParamCache::InstallHome: renamed, not copied).
  absl::Status StoreSteppedParams(absl::Mutex& job_mu) ABSL_LOCKS_EXCLUDED(job_mu);
  // A shard's gradient slot is done with (stepped): its memory goes back,
  // the window's clean params may use it, and the shard is `now`.
  void FreeGradSlot(absl::Mutex& job_mu, uint32_t rank, uint32_t index, const ExchangeSlot& slot, GradAt now)
      ABSL_LOCKS_EXCLUDED(job_mu);
  // Waits for the early pass's write in flight, if any: its result.
  absl::Status WaitEarlyWrite();
  // The staging the early pass's next shard is stepped into (early_staging_'s).
  std::byte* EarlyStaging();
  // Ends the param cache's update if an early pass began it (update_begun_).
  void EndBegunUpdate();
  // After the step: every gradient slot's memory back, the spilled copies
  // deleted (before the commit, so none becomes durable).
  void ClearGradsAfterStep(absl::Mutex& job_mu) ABSL_LOCKS_EXCLUDED(job_mu);

  const uint64_t job_id_;
  const std::string job_name_;
  const uint32_t world_size_;
  const SlotDTypes dtypes_;
  const uint64_t pinned_budget_bytes_;  // the job's setting (0: everything may stay up)
  const bool early_apply_;
  ExtentStore* const nvme_;
  PinnedBudget* const pinned_;
  ParamStore* const params_store_;
  PinnedBudget::Reservation staging_reservation_;  // NVMe staging tiles
  // The window budget -- the bytes of param and gradient slots the job keeps
  // in memory (its pinned reservation).
  uint64_t param_budget_ = 0;
  uint64_t grad_room_ = 0;  // per rank (0: no limit; see GradWindowLocked)
  uint64_t grad_keep_ = 0;
  uint64_t init_batch_bytes_ = 0;  // per rank (0: no limit; see InitBatchBytes)
  PinnedBudget::Reservation window_reservation_;
  ExchangeRegions* regions_ = nullptr;
  std::function<void()> rollback_;
  std::unique_ptr<ParamCache> param_cache_;
  std::unique_ptr<GradSpill> grad_spill_;
  // Where a step (early or not) writes a shard's new params (the largest
  // param slot, pre-faulted): they go home, or under SteppedKey, from here,
  // and into the window slot only when the cache keeps them (StoreHomeFrom).
  AlignedBuffer param_staging_;
  // Early passes: a shard's new params are written to NVMe (SteppedKey)
  // while the pass steps the next shard into the other staging, so the pass
  // never waits for a param write but the one before the last (a write had
  // the next shard's tiles to finish; waited for, the writes were a quarter
  // of a 200M pass). param_staging_ and param_staging_alt_ take turns
  // (early_staging_ is the next shard's). The pass's thread only (the job's
  // states lock), between EarlyStepLocked's hooks and EndEarlyPass.
  AlignedBuffer param_staging_alt_;
  int early_staging_ = 0;
  // The param cache's update (BeginUpdate) began in an early pass, for the
  // shards stepped once the step was certain; BeginStep finds it begun.
  bool update_begun_ = false;
  std::future<absl::Status> early_write_;  // declared after the stagings: waited for first

  // Guarded by the job's lock (the job_mu the ...Locked methods take).
  std::vector<std::vector<GradAt>> grad_at_;  // per rank and shard
  // GradReady signals per shard (any step): a spill that finds the count
  // changed leaves the slot alone -- it holds a re-sent gradient.
  std::vector<std::vector<uint64_t>> grad_signals_;
  uint64_t grad_resident_bytes_ = 0;  // bytes of gradient slots holding a gradient (kInSlot)
  std::vector<uint64_t> grad_held_;   // the same, per rank
  uint64_t grad_bytes_spilled_ = 0;
  uint64_t grad_bytes_read_back_ = 0;

  // The step in progress (the worker's, between BeginStep and EndStep).
  std::vector<std::vector<GradAt>> step_grad_at_;
  const std::vector<std::vector<ExchangeSlot>>* step_slots_ = nullptr;
};

}  // namespace strata

#endif  // STRATA_DAEMON_INFINITY_PIPELINE_H_
