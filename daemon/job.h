// Job: one training job's state in the daemon -- its settings, registered
// tensors, each rank's partition and shared exchange region, the fp32 masters
// and optimizer states (ShardStateStore), the loss scaler, and the step
// protocol (GradReady from every rank -> one optimizer step -> WaitStep).
//
// A job outlives its trainers: a rank whose process dies keeps its states and
// its exchange region, and a new session of the same rank finds them.
//
// Thread-safe. RPC threads call in; one worker thread per job runs the
// gradient checks and optimizer steps, so no RPC thread blocks on compute
// except in WaitStep, which waits with a deadline.
#ifndef STRATA_DAEMON_JOB_H_
#define STRATA_DAEMON_JOB_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/shard_key.h"
#include "core/zero_partition.h"
#include "daemon/job_record.h"
#include "daemon/job_settings.h"
#include "daemon/loss_scaler.h"
#include "daemon/param_cache.h"
#include "daemon/shard_state_store.h"
#include "optimizer_cpu/cpu_optimizer.h"
#include "tiers/pinned_arena.h"

namespace strata {

class ExtentStore;

// One shard a rank exchanges with the daemon, and where its slots are in the
// rank's exchange region.
struct ExchangeSlot {
  ShardLayout layout;  // index, padded size, owned tensor ranges
  uint64_t grad_offset = 0;
  uint64_t param_offset = 0;
};

struct StepOutcome {
  bool skipped = false;
  double next_loss_scale = 1.0;
  double grad_norm = 0.0;
  uint64_t optimizer_steps = 0;
};

struct JobCounters {
  uint64_t steps_applied = 0;
  uint64_t steps_skipped = 0;
  double last_step_s = 0;
  double total_step_s = 0;
  ParamCacheStats params;
};

// What the job borrows from the daemon; all must outlive it.
struct JobServices {
  CpuOptimizer* optimizer = nullptr;
  // Required for MODE_INFINITY. Shared by all jobs and safe for concurrent
  // use; each job commits only its own shards (ExtentStore::Commit(id)).
  ExtentStore* nvme = nullptr;
  uint64_t io_tile_bytes = 64ull << 20;
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
  absl::Status Register(uint32_t rank, const std::vector<TensorSpec>& tensors);
  bool registered() const;
  // REQUIRES: registered().
  std::vector<ExchangeSlot> SlotsOf(uint32_t rank) const;
  int ExchangeFdOf(uint32_t rank) const;
  uint64_t ExchangeBytesOf(uint32_t rank) const;

  // The rank wrote its initial params into its param slots.
  absl::Status InitParams(uint32_t rank);
  // The gradient of `index` for `step` is in the rank's grad slot. Sending the
  // same gradient again before the step runs replaces it (a restarted rank
  // redoes its step). FailedPrecondition for a step already applied or not
  // yet reached, or before every rank called InitParams... (see .cc).
  absl::Status GradReady(uint32_t rank, uint32_t index, uint64_t step);
  // Waits until step `step` is applied (or skipped), or `deadline`.
  absl::StatusOr<StepOutcome> WaitStep(uint64_t step, absl::Time deadline);

  // ZeRO-Infinity: make the param shards `indices` current in the rank's param
  // slots, and pin them there until Release.
  absl::Status Acquire(uint32_t rank, const std::vector<uint32_t>& indices, absl::Time deadline);
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
  absl::Status SaveTo(const std::string& directory) const;
  static absl::StatusOr<std::unique_ptr<Job>> LoadFrom(uint64_t id, const std::string& directory,
                                                       const std::string& new_name, JobServices services);

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
  // The job is deleted (by request or expiry): after Stop, removes its
  // record and shards from NVMe in one commit, so it stays deleted after a
  // restart and its space is free. Later commits of the job are refused.
  absl::Status Retire();

 private:
  struct RankState {
    std::vector<ExchangeSlot> slots;
    PinnedArena exchange;
    bool initialized = false;
    std::vector<bool> grad_ready;
    std::vector<bool> applied;  // stepped early, this step (see early_apply_)
  };
  struct WorkItem {
    enum Kind { kInspect, kRunStep, kStop } kind;
    uint32_t rank = 0;
    uint32_t index = 0;
  };

  Job(uint64_t id, JobSettings settings, JobServices services);
  absl::Status BuildLayoutsLocked(const std::vector<TensorSpec>& tensors, bool adopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobRecord RecordLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks every rank initialized and restores the step counts and scaler.
  void ApplyRecordLocked(const JobRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the record into the extent store (the caller commits).
  absl::Status WriteRecord(const std::string& record);
  // Writes `record` and commits the job's shards with it -- this job's
  // writes only. On failure the job's uncommitted writes are rolled back, so
  // NVMe holds its last committed step. Refused once the job is retired.
  absl::Status CommitWithRecord(const std::string& record);
  void WorkerLoop();
  // Worker side.
  void Inspect(uint32_t rank, uint32_t index);
  void RunStep();
  // REQUIRES: states_mu_ held.
  absl::Status ApplyShards(const std::vector<ShardId>& ids, const std::vector<std::vector<ExchangeSlot>>& slots,
                           int64_t optimizer_step, float grad_scale);
  std::byte* GradSlot(uint32_t rank, const ExchangeSlot& slot) const;
  std::byte* ParamSlot(uint32_t rank, const ExchangeSlot& slot) const;

  const uint64_t id_;
  const JobSettings settings_;
  const JobServices services_;
  // ZeRO-Offload without loss scaling or clipping: each shard is stepped as
  // soon as its gradient is in, overlapping the trainers' backward. With
  // either, the update depends on every rank's gradients and waits for all.
  const bool early_apply_;
  std::unique_ptr<ShardStateStore> states_;
  // One states_ pass at a time: the NVMe store streams through one set of
  // staging tiles, and ranks call InitParams concurrently.
  mutable absl::Mutex states_mu_;
  std::unique_ptr<ParamCache> param_cache_;  // MODE_INFINITY only
  // Orders the job's commits against Retire (a commit racing a delete must
  // not bring the job back).
  absl::Mutex commit_mu_;
  bool retired_ ABSL_GUARDED_BY(commit_mu_) = false;
  std::vector<TensorSpec> tensors_;         // fixed at the first Register

  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<RankState> ranks_ ABSL_GUARDED_BY(mu_);
  uint64_t next_step_ ABSL_GUARDED_BY(mu_) = 0;  // the step GradReady fills
  uint64_t grads_missing_ ABSL_GUARDED_BY(mu_) = 0;
  bool step_queued_ ABSL_GUARDED_BY(mu_) = false;
  // Overflow and squared norm per (rank, index) of the step being filled.
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, std::pair<bool, double>> inspections_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, StepOutcome> outcomes_ ABSL_GUARDED_BY(mu_);
  absl::Status worker_error_ ABSL_GUARDED_BY(mu_);
  LossScaler scaler_ ABSL_GUARDED_BY(mu_);
  uint64_t optimizer_steps_ ABSL_GUARDED_BY(mu_) = 0;
  JobCounters counters_ ABSL_GUARDED_BY(mu_);
  std::deque<WorkItem> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace strata

#endif  // STRATA_DAEMON_JOB_H_
