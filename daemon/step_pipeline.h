// StepPipeline: what a job's mode decides, behind one interface. A Job (see
// daemon/job.h) owns one:
//   OffloadPipeline  (daemon/offload_pipeline.h)  ZeRO-Offload: states in
//     pinned host memory, params always in the ranks' populated regions,
//     shards stepped early when nothing global decides them.
//   InfinityPipeline (daemon/infinity_pipeline.h) ZeRO-Infinity: states and
//     param homes on NVMe, committed with the job's record every step; the
//     regions are a window within a budget -- a ParamCache for the params and
//     a GradSpill for gradients that do not fit.
//
// Locking: methods named ...Locked take the job's lock (Job::mu_) as
// `job_mu` and are called with it held; the state they touch is guarded by
// it (a few release it around I/O and say so). The others are called without it.
#ifndef STRATA_DAEMON_STEP_PIPELINE_H_
#define STRATA_DAEMON_STEP_PIPELINE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/shard_key.h"
#include "daemon/exchange_window.h"
#include "daemon/param_cache.h"
#include "daemon/shard_state_store.h"
#include "optimizer_cpu/hyperparams.h"
#include "swap/aligned_buffer.h"

namespace strata {

struct JobCounters;
struct JobServices;
struct JobSettings;
class TransferExecutor;

// How a step's shards meet the optimizer (Job::ApplyShards): where each
// shard's gradient comes from (empty: its gradient slot), where its new
// params are written (empty: its param slot; else memory of the padded slot's
// size, valid until shard_done returns) and what follows its last tile
// (empty: nothing).
struct StepHooks {
  std::function<absl::StatusOr<const std::byte*>(const ShardId&)> grad_source;
  std::function<std::byte*(const ShardId&)> param_target;
  std::function<absl::Status(const ShardId&)> shard_done;
  // Before the first shard (empty: nothing): the pipeline finishes what the
  // shards stepped early left to the step (Infinity: their params go home).
  std::function<absl::Status()> before_shards;
};

// A rank's gradient window (core/doorbell_layout.h, grad_room_bytes): the
// bytes of gradient it may have in its slots at once (0: no limit), the hold
// the pipeline comes down to by spilling, and what it holds now.
struct GradWindow {
  uint64_t room = 0;
  uint64_t keep = 0;
  uint64_t held = 0;
};

class StepPipeline {
 public:
  virtual ~StepPipeline() = default;

  // --- What the mode is.
  // The job's states and record are durable on NVMe: a step commits with
  // the record, a failed one rolls back, the job survives a restart.
  virtual bool durable() const = 0;
  // Shards may be stepped as soon as their gradients are in, before the rest
  // of the step (EarlyStepLocked says which); else a step waits for every
  // rank. ZeRO-Offload: without loss scaling or clipping. ZeRO-Infinity:
  // without clipping -- with loss scaling the early updates are speculative
  // (uncommitted NVMe writes; an overflow rolls them back, see Job::RunStep).
  virtual bool early_apply() const = 0;
  // The regions are windows (memory only for the slots in use; gradients may
  // be spilled, and a spill ends by discarding the slot), not populated.
  virtual bool windowed() const = 0;

  // --- Building (the job's lock held).
  // The store of the fp32 masters and optimizer states, with the job-wide
  // pinned memory it needs reserved.
  virtual absl::StatusOr<std::unique_ptr<ShardStateStore>> MakeStates(const StateLayout& layout,
                                                                      uint64_t tile_bytes) = 0;
  // Checks rank `rank`'s laid-out slots against the mode's limits and gives
  // the pinned bytes the rank itself needs (its region and host states; 0:
  // none beyond the job's).
  virtual absl::StatusOr<uint64_t> RankPinnedBytes(uint32_t rank, const ExchangeLayout& layout,
                                                   const StateLayout& states) const = 0;
  // Every rank the first registration builds is built (`built`: their slots).
  // `rollback` drops the job's uncommitted NVMe writes (it takes the job's
  // commit lock, never its main one).
  virtual absl::Status OpenWindow(const std::vector<const std::vector<ExchangeSlot>*>& built,
                                  ExchangeRegions* regions, TransferExecutor* workers,
                                  std::function<void()> rollback) = 0;
  // Rank `rank` (of `world`) is built with `shards` shards; or it failed.
  virtual void AddRankLocked(absl::Mutex& job_mu, uint32_t rank, uint32_t world, size_t shards)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu) = 0;
  virtual void DropRankLocked(absl::Mutex& job_mu, uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu) = 0;
  // The first registration failed: the window goes (before the states), then
  // what the job reserved (after them).
  virtual void CloseWindow() = 0;
  virtual void ReleasePinned() = 0;
  // What the job reserved of the pinned budget (beyond the ranks' own).
  virtual uint64_t pinned_bytes() const = 0;
  // The window's figures (the job's lock held).
  virtual void CountLocked(absl::Mutex& job_mu, JobCounters& counters) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu) = 0;
  virtual ParamCacheStats param_stats() const = 0;
  // The job's view of the daemon's param store (Infinity, once the window is
  // open; else nullptr): Job::AcquireIn's device tier, Park, Resume, and a
  // superseded job handing its shards over (daemon/job_tiers.cc).
  virtual ParamCache* params() { return nullptr; }

  // --- Params.
  // A shard's params were written into its slot (InitParams, LoadFrom).
  virtual absl::Status ParamsWritten(uint32_t rank, uint32_t index) = 0;
  // InitParams: as ParamsWritten, for a shard the trainer wrote as part of a
  // batch (InitBatchBytes); the next batch may need the room.
  virtual absl::Status ParamsInitialized(uint32_t rank, uint32_t index) { return ParamsWritten(rank, index); }
  // The most bytes of param slots a rank should write before each
  // InitParams so the window stays within its budget (0: no limit).
  virtual uint64_t InitBatchBytes() const { return 0; }
  // The params of `slot` to save: `in_slot`, or their home read into `scratch`.
  virtual absl::StatusOr<const std::byte*> ParamsToSave(uint32_t rank, const ExchangeSlot& slot,
                                                        const std::byte* in_slot,
                                                        std::optional<AlignedBuffer>& scratch) const = 0;
  virtual absl::Status Acquire(uint32_t rank, const std::vector<uint32_t>& indices, absl::Time deadline) = 0;
  virtual absl::Status Release(uint32_t rank, const std::vector<uint32_t>& indices) = 0;
  virtual void IterationBoundary(uint32_t rank) = 0;
  virtual void DropPins(uint32_t rank) = 0;

  // --- Gradients.
  // GradReady took the gradient of (rank, index) for the open step.
  virtual void GradArrivedLocked(absl::Mutex& job_mu, uint32_t rank, uint32_t index, const ExchangeSlot& slot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu) = 0;
  // The gradient was inspected. May release job_mu while it writes the
  // gradient out; returns with it held. An error fails the step.
  virtual absl::Status AfterInspectLocked(absl::Mutex& job_mu, uint32_t rank, uint32_t index,
                                          const ExchangeSlot& slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu) = 0;
  // Rank `rank`'s gradient window, which the job publishes in the rank's
  // doorbell after every call above and every shard stepped. No limit (the
  // default) where the region holds every slot.
  virtual GradWindow GradWindowLocked(absl::Mutex& job_mu, uint32_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu);
  // The gradient of (rank, index) was inspected and early_apply() holds: the
  // hooks to step this shard with now, or nullopt to leave it to the step.
  // `step_certain`: every gradient of the step is in and none overflowed, so
  // the step can no longer be skipped (it can still fail). Default: now,
  // from and into its slots.
  virtual std::optional<StepHooks> EarlyStepLocked(absl::Mutex& job_mu, uint32_t rank, uint32_t index,
                                                   const ExchangeSlot& slot, bool step_certain)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_mu);

  // An early pass (the shards of EarlyStepLocked's hooks, one ApplyShards)
  // ended, `failed` or not: what its hooks left running is done when this
  // returns, and its error is the pass's. Default: nothing left.
  virtual absl::Status EndEarlyPass(bool /*failed*/) { return absl::OkStatus(); }

  // --- The optimizer step (the job's states lock held, its main lock not).
  // `ids` are stepped in order over `slots`, which stay valid until EndStep.
  virtual StepHooks BeginStep(absl::Mutex& job_mu, const std::vector<ShardId>& ids,
                              const std::vector<std::vector<ExchangeSlot>>& slots)
      ABSL_LOCKS_EXCLUDED(job_mu) = 0;
  virtual void EndStep(absl::Mutex& job_mu) ABSL_LOCKS_EXCLUDED(job_mu) = 0;
  // A skipped step (overflow): its gradients are not needed either.
  virtual void SkipStep(absl::Mutex& job_mu) ABSL_LOCKS_EXCLUDED(job_mu) = 0;
};

// The pipeline of `settings.mode`; FailedPrecondition when the daemon lacks a
// service the mode needs (MODE_INFINITY without an NVMe tier).
absl::StatusOr<std::unique_ptr<StepPipeline>> MakeStepPipeline(uint64_t job_id, const JobSettings& settings,
                                                               const JobServices& services);

}  // namespace strata

#endif  // STRATA_DAEMON_STEP_PIPELINE_H_
