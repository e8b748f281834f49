// Job: one training job's state in the daemon -- its settings, registered
// tensors, each rank's partition and shared exchange region, the fp32 masters
// and optimizer states (ShardStateStore), the loss scaler, and the step
// protocol (GradReady from every rank -> one optimizer step -> WaitStep).
//
// A job outlives its trainers: a rank whose process dies keeps its states and
// its exchange region, and a new session of the same rank finds them.
//
// Thread-safe. RPC threads call in; the daemon's worker pool (shared by every
// job, JobServices::workers) runs the gradient checks and optimizer steps, so
// no RPC thread blocks on compute except in WaitStep, which waits with a
// deadline. A job's work items run one at a time and in order, one item per
// turn on the pool (see ScheduleLocked).
#ifndef STRATA_DAEMON_JOB_H_
#define STRATA_DAEMON_JOB_H_

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/shard_key.h"
#include "core/tier_kind.h"
#include "core/zero_partition.h"
#include "daemon/doorbell.h"
#include "daemon/exchange_window.h"
#include "daemon/grad_spill.h"
#include "daemon/job_device_tier.h"
#include "daemon/job_record.h"
#include "daemon/job_settings.h"
#include "daemon/loss_scaler.h"
#include "daemon/param_cache.h"
#include "daemon/pinned_budget.h"
#include "daemon/request_limits.h"
#include "daemon/shard_state_store.h"
#include "daemon/step_barrier.h"
#include "daemon/step_pipeline.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "tiers/pinned_arena.h"
#include "tiers/transfer_executor.h"

namespace strata {

class ExtentStore;
class ParamStore;
class Tier;

// Where the last finished optimizer step's time went (GetStats' StepTimes,
// `strata stats`). The streaming thread fills one during RunStep and the job
// publishes it under its mutex when the step ends; all in seconds.
struct StepTimes {
  // The step's first accepted GradReady to RunStep's start: the trainers'
  // gradient writes, their inspections and (Infinity) spills. In training
  // this overlaps backward; a benchmark that sends every gradient at once
  // sees it as pure overhead.
  double gradients_in_s = 0;
  double stream_s = 0;       // ApplyShards: the pass over every shard's states
  // Inside stream_s (Infinity's NvmeShardStateStore; 0 for host states):
  double load_wait_s = 0;    // blocked waiting for a state tile's load
  double save_wait_s = 0;    // blocked on a tile's save (the set's reuse, the final drain)
  double optimizer_s = 0;    // CpuOptimizer::Step calls
  double grads_back_s = 0;   // the pipeline's grad_source (a spilled gradient read back)
  double params_home_s = 0;  // the pipeline's shard_done (new params written home)
  double end_s = 0;          // the pipeline's EndStep (its writes drained)
  double commit_s = 0;       // CommitWithRecord (Infinity: the step made durable)
  // Shards stepped while gradients were still coming in (the early path:
  // Job::Inspect, and RunEarlySteps' passes); the step's pass did the rest.
  uint64_t shards_early = 0;
  // The passes that stepped them: RunEarlySteps steps the shards inspected
  // since its last pass together (shards_early / early_passes a pass).
  uint64_t early_passes = 0;
  // The early passes' own breakdown (inside gradients_in_s, overlapping the
  // trainers' backward; not in stream_s): their passes over the states, and
  // of that the time blocked on state-tile loads and on the new params'
  // writes.
  double early_stream_s = 0;
  double early_load_wait_s = 0;
  double early_params_home_s = 0;
  // Infinity: gradient bytes written to NVMe because the window was full
  // (since the previous step ended) and read back by this step -- NVMe
  // traffic beyond the states and params that the budget costs.
  uint64_t grad_bytes_spilled = 0;
  uint64_t grad_bytes_read_back = 0;
};

struct JobCounters {
  uint64_t steps_applied = 0;
  uint64_t steps_skipped = 0;
  double last_step_s = 0;
  double total_step_s = 0;
  ParamCacheStats params;
  StepTimes last_step;  // all zero until a step finished (applied; a skipped step keeps the last)
  uint64_t grad_bytes_spilled = 0;    // Infinity: gradients written to NVMe (window full)
  uint64_t grad_bytes_read_back = 0;
  // Shards stepped early (before their step's last gradient), over the
  // job's life, a skipped step's included.
  uint64_t shards_stepped_early = 0;
  // The passes that stepped them (Job::RunEarlySteps steps the shards
  // inspected meanwhile together): shards_stepped_early / early_passes is
  // the mean batch.
  uint64_t early_passes = 0;
  // The job's share of the pinned tier: what it reserved of the daemon's
  // pinned_capacity (regions or window budget, host states, NVMe staging).
  uint64_t pinned_reserved_bytes = 0;
  // Infinity: the window's budget and what its ranks' regions hold now.
  uint64_t window_budget_bytes = 0;
  uint64_t window_resident_bytes = 0;
  // The state store's staging (Infinity: the NVMe tile and its pinned buffers).
  StateStaging staging;
};

// Where an acquired param shard sits now, for the trainer: its tier and its
// offset there -- in the rank's exchange window (kPinnedHost) or in the
// daemon's device arena (kDevice), which the trainer maps once per session.
struct ShardPlace {
  uint32_t index = 0;
  TierKind tier = TierKind::kPinnedHost;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// What Park or Resume moved, and how long it took (for the caller to set
// against bytes / bandwidth).
struct ParkReport {
  TierKind tier = TierKind::kNvme;  // where the job's shards are now (at most)
  uint64_t shards = 0;
  uint64_t bytes_moved = 0;
  double seconds = 0;
};

// What the job borrows from the daemon; all must outlive it.
struct JobServices {
  CpuOptimizer* optimizer = nullptr;
  // Required for MODE_INFINITY. Shared by all jobs and safe for concurrent
  // use; each job commits only its own shards (ExtentStore::Commit(id)).
  ExtentStore* nvme = nullptr;
  uint64_t io_tile_bytes = 64ull << 20;
  // How long an early pass (Job::RunEarlySteps) waits for its next shard
  // before it ends: long enough for the next gradient of a backward (tens of
  // milliseconds apart), short enough that a job whose trainers went quiet
  // gives the pool's thread back to other jobs soon.
  absl::Duration early_pass_wait = absl::Milliseconds(200);
  // Caps checked when tensors are registered (nullptr: the defaults).
  const RequestLimits* limits = nullptr;
  // The daemon's pinned host memory, shared by all jobs (nullptr: unlimited).
  PinnedBudget* pinned = nullptr;
  // The daemon's bounded worker pool, shared by all jobs (FIFO; nullptr: the
  // job makes a one-thread pool of its own).
  TransferExecutor* workers = nullptr;
  // The per-bucket signal path (daemon/doorbell.h); nullptr: gRPC only.
  DoorbellHub* doorbells = nullptr;
  // The daemon's device tier (virtual GPU memory: daemon/device_arena.h),
  // which carves a job with a device budget its own arena (Job::Create);
  // nullptr when the daemon runs without one (--device none).
  JobDeviceTier* device = nullptr;
  // The daemon's one tiered store for Infinity params (daemon/param_store.h);
  // nullptr: each Infinity job keeps a store of its own (tests, tools).
  ParamStore* params = nullptr;
};

// How a checkpoint is written for its caller (daemon/checkpoint_dir.h,
// daemon/checkpoint_quota.h).
struct CheckpointWrite {
  uint64_t max_bytes = UINT64_MAX;  // what the caller's quota leaves
  std::optional<uid_t> owner;       // its files and directory are given to this uid
};

class Job {
 public:
  static absl::StatusOr<std::unique_ptr<Job>> Create(uint64_t id, JobSettings settings,
                                                     JobServices services);
  ~Job();

  uint64_t id() const { return id_; }
  const JobSettings& settings() const { return settings_; }

  // Registers the model (the first call fixes the tensor list and builds every
  // rank's partition, exchange region and states; later calls must send the
  // same list: InvalidArgument naming the first difference).
  // `groups` holds each tensor's param group (empty: all in group 0); every
  // rank must send the same groups.
  //
  // `partition`, when not empty, is the rank's own partition (the trainer's):
  // then every rank must send one, shard i must have index i, ranges must lie
  // inside their tensor and shard without overlapping, and once every rank
  // has registered each element of each tensor must be owned exactly once
  // (checked when the daemon serves every rank; InvalidArgument naming the
  // problem otherwise).
  absl::Status Register(uint32_t rank, const std::vector<TensorSpec>& tensors,
                        const std::vector<uint32_t>& groups = {},
                        const std::vector<ShardLayout>& partition = {});
  bool registered() const;
  // REQUIRES: registered().
  std::vector<ExchangeSlot> SlotsOf(uint32_t rank) const;
  int ExchangeFdOf(uint32_t rank) const;
  uint64_t ExchangeBytesOf(uint32_t rank) const;
  // The rank's doorbell (daemon/doorbell.h), made on first use and kept for
  // the job's life (a re-attached rank gets the same one). The fds stay
  // owned by the job. Unimplemented when the daemon has no doorbell hub.
  struct DoorbellFds {
    int memfd = -1;
    int eventfd = -1;
    uint64_t bytes = 0;
  };
  absl::StatusOr<DoorbellFds> OpenDoorbell(uint32_t rank);

  // The rank wrote the initial params of `indices` (every shard of the rank
  // when empty) into their param slots: their optimizer states are made and
  // their params go home. The rank is initialized once each of its shards
  // has been. InvalidArgument for an index out of range or listed twice.
  absl::Status InitParams(uint32_t rank, absl::Span<const uint32_t> indices = {});
  // ZeRO-Infinity with a pinned budget: the most bytes of param slots a rank
  // should write before each InitParams (RegisterTensorsResponse), so the
  // window stays within the budget while the model comes in; 0: no limit.
  uint64_t InitBatchBytes() const;
  // The gradient of `index` for `step` is in the rank's grad slot. Sending the
  // same gradient again before the step runs replaces it (a restarted rank
  // redoes its step). FailedPrecondition for a step already applied or not
  // yet reached, or before every rank called InitParams... (see .cc).
  absl::Status GradReady(uint32_t rank, uint32_t index, uint64_t step);
  // Sets step `step`'s hyperparameters per param group (index = group); they
  // stay in force for later steps until the next BeginStep. The first call
  // for a step wins; a later one must be equal (InvalidArgument naming the
  // group and field). FailedPrecondition after the step's first GradReady or
  // for a step that is not the open one; InvalidArgument when `groups` does
  // not cover every registered group or a value is out of range.
  absl::Status BeginStep(uint64_t step, const std::vector<GroupHyperparams>& groups);
  // external_step_agreement only: waits (until `deadline`) for every local
  // rank's gradients of `step`, and returns this daemon's overflow flag and
  // squared norm (ranks summed pairwise in rank order, shards in order).
  absl::StatusOr<StepStats> PrepareStep(uint64_t step, absl::Time deadline);
  // The values agreed across daemons decide the step. The first commit wins;
  // a different later one is InvalidArgument.
  absl::Status CommitStep(uint64_t step, const StepStats& global);
  // Waits until step `step` is applied (or skipped), or `deadline`.
  absl::StatusOr<StepOutcome> WaitStep(uint64_t step, absl::Time deadline);

  // ZeRO-Infinity: make the param shards `indices` current in the rank's param
  // slots, and pin them there until Release.
  absl::Status Acquire(uint32_t rank, const std::vector<uint32_t>& indices, absl::Time deadline);
  // As above, into `tier` (kPinnedHost: the rank's window; kDevice: the
  // daemon's device arena, for a job with a device budget), returning where
  // each shard sits now, in the order of `indices`.
  absl::StatusOr<std::vector<ShardPlace>> AcquireIn(uint32_t rank, const std::vector<uint32_t>& indices,
                                                    TierKind tier, absl::Time deadline);
  // Pushes every shard of the job down to `to` (kPinnedHost or kNvme) and
  // frees its copies above it (RLHF phase switches, GPU time-sharing); the
  // job must hold no pins (FailedPrecondition naming the rank otherwise).
  // Resume brings back what Park pushed down. See daemon/job_tiers.cc.
  absl::StatusOr<ParkReport> Park(TierKind to);
  absl::StatusOr<ParkReport> Resume();
  absl::Status Release(uint32_t rank, const std::vector<uint32_t>& indices);
  absl::Status IterationBoundary(uint32_t rank);
  // Drops every pin the rank holds (its session ended).
  void DropPins(uint32_t rank);

  uint64_t next_step() const;
  double loss_scale() const;
  JobCounters counters() const;
  uint64_t params() const;
  const std::vector<TensorSpec>& tensors() const { return tensors_; }

  // Checkpoint support: every rank's shards' states, params and the scaler.
  // The checkpoint `name` is made inside the open directory `parent_fd`
  // (daemon/checkpoint_dir.h resolves it beneath --checkpoint_root) and must
  // not exist; nothing that exists is replaced and no link is followed.
  // Only the job's own lock is held, and only while its record is copied:
  // other jobs' calls never wait for a save's I/O.
  // Returns the bytes its files hold. A save that would write more than
  // `write.max_bytes` stops with ResourceExhausted and leaves nothing behind.
  absl::StatusOr<uint64_t> SaveTo(int parent_fd, const std::string& name, const std::string& display,
                                  const CheckpointWrite& write = {}) const;
  // `dir_fd`: the checkpoint directory, open. `may_load` sees the owner uid
  // recorded in the manifest (absent in old ones) and may refuse; the new
  // job belongs to `new_owner`.
  static absl::StatusOr<std::unique_ptr<Job>> LoadFrom(
      uint64_t id, int dir_fd, const std::string& display, const std::string& new_name, uint32_t new_owner,
      const std::function<absl::Status(std::optional<uint32_t>)>& may_load, JobServices services);

  // ZeRO-Infinity jobs survive a daemon restart: their record (settings,
  // tensors, step count, loss scaler) is an extent-store shard under this key,
  // committed together with the step's states, so the two always agree.
  static ShardKey RecordKey(uint64_t job_id);
  static bool IsRecordKey(const ShardKey& key);
  // Rebuilds a job from its record; its states and params stay on NVMe.
  static absl::StatusOr<std::unique_ptr<Job>> Restore(uint64_t id, const std::string& record,
                                                      JobServices services);

  // Stops the worker after the step in progress (graceful shutdown).
  void Stop();
  // ZeRO-Infinity: an optimizer step failed (an NVMe fault: EIO, ENOSPC, a
  // torn write, a checksum mismatch) and was rolled back, so the job's state
  // on NVMe is its last committed step. JobRegistry::Attach then replaces the
  // job by one restored from that commit, as after a restart.
  bool NeedsReload() const;
  // For that replacement: stops the worker, waits out any pass over the
  // states, and drops the job's uncommitted NVMe writes; from then on this
  // object neither commits nor rolls back (its replacement has the same id).
  void Supersede();
  // The job is deleted (by request or expiry): after Stop, removes its
  // record and shards from NVMe in one commit, so it stays deleted after a
  // restart and its space is free. Later commits of the job are refused.
  absl::Status Retire();

 private:
  // A rank: its window (slots and region: daemon/exchange_window.h) and
  // where its shards are in the step.
  struct RankState : ExchangeWindow {
    bool initialized = false;
    std::vector<bool> shard_initialized;  // InitParams so far, per shard
    // Inspections of this rank's gradients queued or running (each may
    // spill and then discard the slot). A re-attached rank's Register waits
    // for 0, so its new process never writes a slot a discard then zeroes.
    uint32_t grad_work = 0;
    bool built = false;         // slots, region and states exist
    PinnedBudget::Reservation pinned;  // the region and (offload) host states
  };
  struct WorkItem {
    enum Kind { kInspect, kRunStep, kPrepare, kPreload, kEarlySteps, kStop } kind;
    uint32_t rank = 0;
    uint32_t index = 0;
  };

  Job(uint64_t id, JobSettings settings, JobServices services, std::unique_ptr<StepPipeline> pipeline);
  // The daemon's request limits, or the defaults when none were passed in.
  const RequestLimits& Limits() const;
  // Creates the state store and every local rank's shards: the daemon's own
  // partition, or `supplied` (per rank; ranks without one are built when
  // they register).
  absl::Status BuildLayoutsLocked(const std::vector<TensorSpec>& tensors, bool adopt,
                                  const std::vector<std::vector<ShardLayout>>* supplied = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One rank's slots, exchange region and states.
  absl::Status BuildRankLocked(uint32_t r, std::vector<ShardLayout> shards, bool adopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks a trainer-supplied partition of `rank` against the tensors and the
  // ranks registered so far; on success records its ranges in owned_.
  absl::Status AdmitPartitionLocked(uint32_t rank, const std::vector<ShardLayout>& shards)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobRecord RecordLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The hyperparameters in force, one per group.
  std::vector<OptimizerHyperparams> HyperparamsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks a record's stored partitions (one per rank) as AdmitPartitionLocked
  // checks a trainer's; a bad one is DataLoss (restart).
  absl::Status AdmitRecordedPartitionsLocked(const std::vector<std::vector<ShardLayout>>& partitions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the tensors and their groups from a record (restart).
  absl::Status AdoptTensorsLocked(const JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks every rank initialized and restores the step counts and scaler.
  void ApplyRecordLocked(const JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the record into the extent store (the caller commits).
  absl::Status WriteRecord(const std::string& record);
  // Writes `record` and commits the job's shards with it -- this job's
  // writes only. On failure the job's uncommitted writes are rolled back, so
  // NVMe holds its last committed step. Refused once the job is retired.
  absl::Status CommitWithRecord(const std::string& record);
  // Hands the job to the worker pool when it has queued work and no turn is
  // scheduled or running. One turn runs one item and then queues the job's
  // next turn behind every other job's, so jobs take turns: a job with many
  // items (or a long step) holds at most one pool thread.
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunTurn();
  // Doorbell side (job_doorbell.cc): what the ranks' doorbell pages say --
  // the open step, steps done, closed/failed -- and a finished step.
  void PublishDoorbellsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rank `rank`'s gradient window (StepPipeline::GradWindowLocked) into its
  // doorbell, after each change: the trainer's WaitGradRoom reads it there.
  void PublishGradWindowLocked(uint32_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PublishStepLocked(uint64_t step, const StepOutcome& outcome) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A trainer wrote a wild value into its doorbell: the job fails.
  void FailFromDoorbell(const absl::Status& status);
  // Destroys the doorbells outside mu_ (each waits for a drain in progress,
  // which calls GradReady).
  void CloseDoorbells();
  // Worker side.
  void Inspect(uint32_t rank, uint32_t index);
  // One queued item of the job's turn (RunTurn's, or an early pass's
  // between its tiles).
  void RunItem(const WorkItem& item) ABSL_LOCKS_EXCLUDED(mu_);
  // Steps early, in one pass over the states, the shards early_ready_ holds
  // and those inspected while the pass runs, and once every gradient is in,
  // the rest of the step's (NextEarlyShardLocked): a durable job's states
  // stream from NVMe, and one pass overlaps each shard's load and save with
  // its neighbours'.
  void RunEarlySteps();
  // The shards of one early pass, taken while it runs.
  struct EarlyPass {
    std::vector<std::vector<ExchangeSlot>> slots;  // AllSlotsLocked at the pass's start
    // Each shard's own hooks (the pipeline's EarlyStepLocked).
    absl::node_hash_map<std::pair<uint32_t, uint32_t>, StepHooks> hooks;
    // Once every gradient is in: the step's shards not stepped yet (none
    // after an overflow), and how many of them the pass has looked at.
    std::optional<std::vector<ShardId>> rest;
    size_t next_rest = 0;
  };
  // The early pass's ShardSource: the next shard it steps (taken from the
  // pipeline: TakeEarlyLocked), running the queued inspections to find one;
  // with `wait`, waits up to services_.early_pass_wait for one (its last
  // tile's save runs meanwhile). nullopt: none (now, or
  // with `wait`, for this pass). Releases mu_ while it inspects or waits.
  std::optional<ShardId> NextEarlyShardLocked(EarlyPass& pass, bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks `id` applied and keeps its hooks in `pass` when the pipeline steps
  // it early now (false: it waits for the step, or was stepped);
  // `step_certain` as in StepPipeline::EarlyStepLocked.
  bool TakeEarlyLocked(EarlyPass& pass, const ShardId& id, bool step_certain = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Steps the shards `next` gives early, in one pass (the pipeline's `hooks`;
  // `slots`: a copy of every rank's, AllSlotsLocked), outside mu_; the
  // caller has marked them applied. On failure the job fails as a failed
  // step does. REQUIRES: mu_ held (released meanwhile).
  void StepEarlyLocked(const ShardSource& next, const std::vector<std::vector<ExchangeSlot>>& slots,
                       const StepHooks& hooks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A copy of every rank's slots (a pass runs outside mu_ on it).
  std::vector<std::vector<ExchangeSlot>> AllSlotsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the job's uncommitted NVMe writes (a failed step), unless it was
  // superseded; takes commit_mu_ only.
  void RollbackUncommitted();
  void RunStep();
  // The open step's first gradient arrived: the state store may start
  // loading the step's first tiles (ShardStateStore::Preload).
  void PreloadStates();
  // The shards the open step visits, in order (those the early path has not
  // stepped already).
  std::vector<ShardId> StepShardsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // REQUIRES: states_mu_ held.
  // Each run of same-group elements is stepped with hp[group].
  // `hooks` are the pipeline's (StepHooks: where gradients come from and new
  // params go, what follows a shard's last tile; empty: the slots); after
  // each shard_done the rank's gradient window is published (it may have
  // freed a slot the trainer waits for). `times`, when set, gets the pass's
  // breakdown (stream, waits, optimizer, hooks).
  absl::Status ApplyShards(const ShardSource& next, const std::vector<std::vector<ExchangeSlot>>& slots,
                           int64_t optimizer_step, float grad_scale, const std::vector<OptimizerHyperparams>& hp,
                           const StepHooks& hooks = StepHooks(), StepTimes* times = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t ParamSlotBytes(const ExchangeSlot& slot) const { return slot_dtypes_.ParamSlotBytes(slot); }

  const uint64_t id_;
  const JobSettings settings_;
  const JobServices services_;
  const SlotDTypes slot_dtypes_;
  // What the mode decides (daemon/step_pipeline.h). Declared before the
  // memory its reservations account for, so they are given back after that
  // is freed; ~Job closes its window before the regions go.
  const std::unique_ptr<StepPipeline> pipeline_;
  std::unique_ptr<ShardStateStore> states_;
  // One states_ pass at a time: the NVMe store streams through one set of
  // staging tiles, and ranks call InitParams concurrently.
  mutable absl::Mutex states_mu_;
  // Orders the job's commits against Retire (a commit racing a delete must
  // not bring the job back).
  absl::Mutex commit_mu_;
  bool retired_ ABSL_GUARDED_BY(commit_mu_) = false;
  bool superseded_ ABSL_GUARDED_BY(commit_mu_) = false;  // see Supersede
  std::vector<TensorSpec> tensors_;         // fixed at the first Register
  std::vector<uint32_t> group_of_;          // param group per tensor, fixed with tensors_
  uint32_t num_groups_ = 1;                 // 1 + the largest group index
  // Trainer-supplied partitions (per rank; empty when the daemon partitions).
  bool supplied_ = false;
  std::vector<std::vector<ShardLayout>> supplied_partitions_;
  // While supplied partitions arrive: per tensor, the owned runs so far
  // (first element -> one past the last, owning rank).
  std::vector<std::map<uint64_t, std::pair<uint64_t, uint32_t>>> owned_;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
  // Where each built rank's slots are, for code that reaches them without
  // mu_: the step's workers and the ParamCache's Locate, which also runs
  // under mu_ (LoadFrom's StoreHome), so it cannot take mu_. BuildRankLocked
  // publishes a rank once (ranks_ never grows once built); its lock is a
  // leaf, never held while taking another.
  ExchangeRegions regions_;
  // The step protocol's state: the open step, whose gradients are in, the
  // hyperparameters, the inspections, the outcomes (daemon/step_barrier.h).
  StepBarrier barrier_ ABSL_GUARDED_BY(mu_);
  absl::Status worker_error_ ABSL_GUARDED_BY(mu_);
  bool reload_needed_ ABSL_GUARDED_BY(mu_) = false;  // see NeedsReload
  LossScaler scaler_ ABSL_GUARDED_BY(mu_);
  uint64_t optimizer_steps_ ABSL_GUARDED_BY(mu_) = 0;
  JobCounters counters_ ABSL_GUARDED_BY(mu_);
  // When the open step's first gradient was accepted (the start of its
  // gradients-in phase); reset when the step ends.
  std::optional<absl::Time> grads_in_start_ ABSL_GUARDED_BY(mu_);
  uint64_t open_step_shards_early_ ABSL_GUARDED_BY(mu_) = 0;  // the open step's, so far
  uint64_t open_step_early_passes_ ABSL_GUARDED_BY(mu_) = 0;
  StepTimes open_step_early_times_ ABSL_GUARDED_BY(mu_);  // the early passes' breakdown, so far
  // Durable jobs: shards inspected while the step waits for others, in
  // inspection order, for the next RunEarlySteps (queued once).
  std::deque<ShardId> early_ready_ ABSL_GUARDED_BY(mu_);
  bool early_steps_queued_ ABSL_GUARDED_BY(mu_) = false;
  // The pipeline's gradient spill counters when the previous step ended
  // (StepTimes' per-step bytes are the difference).
  uint64_t spilled_at_step_end_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t read_back_at_step_end_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<WorkItem> queue_ ABSL_GUARDED_BY(mu_);
  // (rank, index) with an inspection queued and not yet started: a re-sent
  // gradient needs no second one (the queued one reads the new contents), so
  // a rank re-signalling in a loop cannot grow queue_ without bound.
  absl::flat_hash_set<std::pair<uint32_t, uint32_t>> inspect_queued_ ABSL_GUARDED_BY(mu_);
  // Per rank, once the rank mapped its shared memory (OpenDoorbell).
  std::vector<std::unique_ptr<Doorbell>> doorbells_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The pool the job's items run on: services_.workers, or own_workers_.
  std::unique_ptr<ThreadPoolExecutor> own_workers_;
  // The job's own arena in the device tier (a job with a device budget on a
  // daemon with one); its trainers map it and nothing else. Released with
  // the job (the tier frees it once the job's last slot is gone).
  std::unique_ptr<JobDeviceArena> device_arena_;
  TransferExecutor* workers_ = nullptr;
  bool turn_scheduled_ ABSL_GUARDED_BY(mu_) = false;  // a turn is queued on the pool or running
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;         // Stop returned: no more turns
};

}  // namespace strata

#endif  // STRATA_DAEMON_JOB_H_
