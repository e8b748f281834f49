// The strata client: what a trainer links to use stratad.
//
//   auto client = StrataClient::Connect({.socket_path = "/run/strata/stratad.sock"});
//   client->CreateJob({.name = "gpt", .world_size = 2, .mode = JobMode::kOffload,
//                      .deepspeed_config_json = ds_json, .attach_if_exists = true});
//   auto rank = client->Attach("gpt", my_rank);
//   rank->RegisterTensors(tensors);        // maps this rank's shared memory
//   // write initial params into each shard's param slot, then
//   rank->InitParams();
//   for (step = 0; ...; ++step) {
//     rank->BeginStep(step, groups);  // optional: this step's lr, betas, ... per param group
//     // ZeRO-Offload: after backward and your own reduce-scatter, copy this
//     // rank's gradient partition into shard.grad and signal it:
//     for (auto& shard : rank->shards()) { fill(shard.grad); rank->GradReady(shard.index, step); }
//     auto result = rank->WaitStep(step);  // updated params are now in shard.param
//     // copy shard.param to your model, then all-gather across ranks.
//   }
//
// ZeRO-Infinity (mode kInfinity, stage 3): params live on NVMe in the daemon.
// Before a layer runs, Acquire() its shards (the prefetcher has usually
// brought them up already); read shard.param; Release() after the layer.
// Gradients and steps work as in offload mode. Call IterationBoundary() once
// per training iteration so the prefetcher can learn the access order.
//
// The device tier (virtual GPU memory): a job created with a device budget
// on a daemon with a device tier may Acquire(indices, TierKind::kDevice); the
// daemon pages the shards NVMe -> pinned -> device and returns where each
// sits (ShardPlace), offsets in the daemon's device arena, which the session
// maps once (device_arena(): a read-only host mapping of the emulated arena,
// or the opened CUDA IPC pointer on a GPU). DeviceBytes(place) gives an
// emulated shard's bytes. StrataClient::ParkJob / ResumeJob push a job's
// shards down to pinned host or NVMe memory and bring them back.
//
// Several daemons (one per node) serve one job when each is created with its
// JobSpec::local_ranks and external_step_agreement: after GradReady, every
// rank calls PrepareStep, all-reduces the stats with its peers (torch.distributed)
// and calls CommitStep with the global values before WaitStep.
//
// Every call returns a Status and has a deadline (ClientOptions): none blocks
// forever. A rank that dies loses its pins, not its state: Attach again with
// the same job and rank within the daemon's reattach timeout.
//
// Thread-compatible: use one RankSession from one thread at a time.
#ifndef STRATA_CLIENT_STRATA_CLIENT_H_
#define STRATA_CLIENT_STRATA_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "core/dtype.h"
#include "core/group_hyperparams.h"
#include "core/job_mode.h"
#include "core/tier_kind.h"
#include "core/zero_partition.h"

namespace strata {

struct ClientOptions {
  std::string socket_path;                        // stratad's --socket
  absl::Duration rpc_timeout = absl::Seconds(30);  // every call but WaitStep
  absl::Duration step_timeout = absl::Minutes(5);  // WaitStep
  // GradReady and WaitStep go through the daemon's shared-memory doorbell
  // when it offers one (docs/DAEMON.md); false keeps every call on gRPC.
  bool use_doorbell = true;
};

struct OptimizerOverride {
  std::string type;  // "" = take the DeepSpeed config's optimizer
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  bool amsgrad = false;
};

struct JobSpec {
  std::string name;
  uint32_t world_size = 1;
  JobMode mode = JobMode::kOffload;
  std::string deepspeed_config_json = "{}";  // stage, optimizer, fp16/bf16, clipping
  OptimizerOverride optimizer;
  DType param_dtype = DType::kFp16;  // what the daemon writes back
  DType grad_dtype = DType::kFp16;   // what the trainer writes
  uint64_t pinned_budget_bytes = 0;  // 0 = daemon default
  uint64_t device_budget_bytes = 0;
  bool attach_if_exists = false;
  // One daemon per node: the ranks this daemon serves (empty = all).
  std::vector<uint32_t> local_ranks;
  // Steps are decided by PrepareStep/CommitStep across daemons.
  bool external_step_agreement = false;
};

// A daemon's share of a step (PrepareStep), to all-reduce across daemons:
// overflow with MAX/OR, squared_norm with SUM.
struct LocalStepStats {
  bool overflow = false;
  double squared_norm = 0;  // of the loss-scaled gradients of this daemon's ranks
};

struct JobSummary {
  uint64_t job_id = 0;
  std::string name;
  uint32_t world_size = 0;
  uint32_t attached_ranks = 0;
  uint64_t step = 0;
  double loss_scale = 0;
  // ZeRO-Infinity (0 otherwise): the daemon's NVMe staging tile for the job's
  // states and the pinned staging it holds (JobInfo).
  uint64_t nvme_tile_bytes = 0;
  uint64_t nvme_staging_bytes = 0;
  // Shards the daemon stepped while their step's gradients were still coming
  // in, over the job's life (JobInfo).
  uint64_t shards_stepped_early = 0;
};

struct TensorDesc {
  std::string name;
  uint64_t numel = 0;
  uint32_t group = 0;  // param group: BeginStep's index for this tensor
};

// One param group's hyperparameters for one step (BeginStep):
// GroupHyperparams, core/group_hyperparams.h.

// One shard this rank exchanges with the daemon. `ranges` say which tensor
// elements sit where in the shard (element offsets); `grad` and `param` point
// into the shared region (grad_dtype / param_dtype elements, padded_numel each).
struct ShardView {
  uint32_t index = 0;
  uint64_t padded_numel = 0;
  std::vector<OwnedRange> ranges;  // OwnedRange::tensor is the index in the registered list
  std::byte* grad = nullptr;
  std::byte* param = nullptr;
};

// A shard of a trainer-supplied partition (see RegisterTensors).
using ShardLayoutSpec = ShardLayout;

struct StepResult {
  bool skipped = false;      // some rank's gradients overflowed; params unchanged
  double loss_scale = 1.0;   // use this scale for the next step
  double grad_norm = 0.0;    // global gradient norm before clipping
  uint64_t optimizer_steps = 0;
};

// Where an acquired param shard sits now (Acquire with a tier): its tier and
// its byte offset there -- in this rank's shared window (kPinnedHost: the
// same place as ShardView::param) or in the daemon's device arena (kDevice).
struct ShardPlace {
  uint32_t index = 0;
  TierKind tier = TierKind::kPinnedHost;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// The daemon's device arena as this session sees it (see device_arena()).
struct DeviceArenaView {
  enum class Kind : uint8_t { kNone, kMemfd, kCudaIpc };
  Kind kind = Kind::kNone;
  uint64_t bytes = 0;
  // kMemfd: the arena mapped read-only (only the daemon writes shards).
  const std::byte* host = nullptr;
  // kCudaIpc: the arena's device pointer in this process (cudaIpcOpenMemHandle),
  // null when it could not be opened (device_error() says why).
  void* device = nullptr;
};

// What ParkJob / ResumeJob moved and how long it took.
struct ParkResult {
  TierKind tier = TierKind::kNvme;  // where the job's shards are now (at most)
  uint64_t shards = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  // bytes / seconds; 0 when nothing moved.
  double bytes_per_second() const { return seconds > 0 ? static_cast<double>(bytes) / seconds : 0; }
};

// One tier's capacity and use, as GetStats reports them.
struct TierUsage {
  std::string tier;  // "device", "nvme", "pinned"
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
};

// Where a job's last applied optimizer step spent its time, in seconds, as
// the daemon measured it (GetStats' StepTimes; docs/DAEMON.md). All zero
// until a step was applied.
struct StepBreakdown {
  double gradients_in_s = 0;  // first accepted GradReady -> the step's start
  double stream_s = 0;        // the pass over the states; holds the next five
  double load_wait_s = 0;     // blocked waiting for NVMe state-tile loads
  double save_wait_s = 0;     // blocked on state-tile saves
  double optimizer_s = 0;     // the CPU optimizer
  double grads_back_s = 0;    // spilled gradients read back
  double params_home_s = 0;   // new params written home
  double end_s = 0;           // the pipeline's end of step
  double commit_s = 0;        // the step made durable
  uint64_t shards_early = 0;  // shards stepped while gradients came in (not in stream_s)
  uint64_t early_passes = 0;  // the passes that stepped them
  // The early passes (inside gradients_in_s, not stream_s): their passes
  // over the states, and of that blocked on NVMe loads and on param writes.
  double early_stream_s = 0;
  double early_load_wait_s = 0;
  double early_params_home_s = 0;
  uint64_t grad_bytes_spilled = 0;    // gradients written to NVMe since the previous step (window full)
  uint64_t grad_bytes_read_back = 0;  // spilled gradients the step read back
  // gradients in + stream + end + commit: the daemon's share of the step.
  double total_s() const { return gradients_in_s + stream_s + end_s + commit_s; }
};

class RankSession;

class StrataClient {
 public:
  // Connects to the daemon's Unix socket and checks it answers.
  static absl::StatusOr<std::unique_ptr<StrataClient>> Connect(const ClientOptions& options);
  ~StrataClient();

  // Returns the job id. AlreadyExists if the name is taken (unless
  // attach_if_exists and the shape matches).
  absl::StatusOr<uint64_t> CreateJob(const JobSpec& spec);
  absl::StatusOr<std::vector<JobSummary>> ListJobs();
  absl::Status DeleteJob(const std::string& job);
  absl::StatusOr<std::unique_ptr<RankSession>> Attach(const std::string& job, uint32_t rank);
  // Saves the job's full state to `directory` on the daemon's host, atomically.
  // `directory` is relative to the caller's checkpoint home (CheckpointHome).
  absl::Status SaveCheckpoint(const std::string& job, const std::string& directory);
  // The same; returns the checkpoint's absolute path on the daemon's host
  // (owned by the caller, readable by it alone).
  absl::StatusOr<std::string> SaveCheckpointPath(const std::string& job, const std::string& directory);
  // Where this caller's checkpoint directories resolve: the daemon's
  // checkpoint_root for admins, <checkpoint_root>/users/<uid> for others.
  // FailedPrecondition when the daemon has no checkpoint_root.
  absl::StatusOr<std::string> CheckpointHome();
  // Creates job `new_job_name` from a checkpoint; returns its id.
  absl::StatusOr<uint64_t> LoadCheckpoint(const std::string& directory, const std::string& new_job_name);
  // Every tier's capacity and use (the device tier: its arena).
  absl::StatusOr<std::vector<TierUsage>> Tiers();
  // Human-readable stats (what `strata stats` prints).
  absl::StatusOr<std::string> StatsText();
  // Job `job`'s last applied step's breakdown (GetStats); NotFound when the
  // daemon lists no such job of the caller's.
  absl::StatusOr<StepBreakdown> LastStep(const std::string& job);
  absl::Status Noop();
  // Asks the daemon to stop accepting jobs, finish in-flight steps and exit.
  absl::Status Drain();
  // Pushes every shard of `job` down to `tier` (kPinnedHost or kNvme) and
  // frees its copies above (the job must hold no pins); ResumeJob brings them
  // back. Owner or admin only.
  absl::StatusOr<ParkResult> ParkJob(const std::string& job, TierKind tier);
  absl::StatusOr<ParkResult> ResumeJob(const std::string& job);

  // Internal: the connection a RankSession shares.
  struct Connection;

 private:
  explicit StrataClient(std::shared_ptr<Connection> connection);
  std::shared_ptr<Connection> connection_;
};

class RankSession {
 public:
  ~RankSession();  // detaches and unmaps

  uint64_t job_id() const;
  uint32_t rank() const;
  // True when this attach found state from an earlier session of this rank.
  bool reattached() const;
  // The job's step count when attached (steps already applied).
  uint64_t step() const;
  // Bytes of this rank's shared region in memory now (mincore over the
  // mapping; on a shared memfd that counts the region's pages whoever
  // faulted them in), e.g. to watch a ZeRO-Infinity window stay within its
  // budget. May be called from another thread while the session is in use,
  // but not during RegisterTensors (which maps the region).
  // FailedPrecondition before the region is mapped.
  absl::StatusOr<uint64_t> ResidentRegionBytes() const;

  // Registers the model's tensors (every rank sends the same list) and maps
  // this rank's shared region. After a re-attach, call it again with the same
  // list to map the region.
  //
  // `partition`, when given, is this rank's own partition (the trainer's,
  // e.g. DeepSpeed's or FSDP's): shard i with index i, padded_numel and the
  // tensor ranges it holds (OwnedRange::tensor = index in `tensors`). Every
  // rank must then send one, and together they must own every element of
  // every tensor exactly once; the daemon refuses anything else naming the
  // problem. shards() then follows it.
  absl::Status RegisterTensors(absl::Span<const TensorDesc> tensors,
                               absl::Span<const ShardLayoutSpec> partition = {});
  absl::Span<ShardView> shards();
  DType param_dtype() const;
  DType grad_dtype() const;
  uint32_t stage() const;

  // The trainer wrote the initial params of `indices` (every shard when
  // empty) into their param slots. The rank is initialized once each of its
  // shards has been, in one call or several.
  absl::Status InitParams(absl::Span<const uint32_t> indices = {});
  // ZeRO-Infinity with a pinned budget: the most bytes of param slots to
  // write before each InitParams, so the daemon's window never holds more
  // than its budget while the model comes in (a whole 800M-param fp16 model
  // is 1.6 GB); 0 when there is no limit.
  uint64_t init_batch_bytes() const;
  // Initializes every shard in batches of init_batch_bytes(): `write` fills
  // one shard's param slot (shard.param), then each batch is sent with
  // InitParams(indices). Stops at the first error, `write`'s or the daemon's.
  absl::Status InitParamsInBatches(const std::function<absl::Status(ShardView&)>& write);
  // Sets step `step`'s hyperparameters per param group (groups[g] for group
  // g), before the step's first GradReady. Optional: a step without it keeps
  // the last ones set (the job's optimizer settings before any). Any rank may
  // send it; every rank that does must send the same values.
  absl::Status BeginStep(uint64_t step, absl::Span<const GroupHyperparams> groups);
  // With the doorbell (doorbell_active()) the signal is queued in shared
  // memory and this returns at once; a signal the daemon then refuses (a
  // race with another rank, say) is returned by this session's next
  // GradReady, Flush or WaitStep. Mistakes the client can see (an index out
  // of range, a step that is not open) still go through gRPC and fail here.
  absl::Status GradReady(uint32_t index, uint64_t step);
  // ZeRO-Infinity keeps a rank's gradients in memory within its share of the
  // job's pinned budget (the gradient window, docs/DAEMON.md): call this
  // before writing shard `index`'s grad slot. It returns once the daemon has
  // inspected and spilled enough of the gradients signaled before to leave
  // room for this one (at once for other modes, a job without a pinned
  // budget, a slot already claimed and not yet signaled, or without the
  // doorbell). Writing without it works, but the window then grows with the
  // gradients written ahead of the daemon. DeadlineExceeded after the step
  // timeout names the figures.
  absl::Status WaitGradRoom(uint32_t index);
  // Copies `bytes` of gradient into shard `index`'s grad slot at byte
  // `offset` (after WaitGradRoom), the fastest way there is for large copies
  // (client/slot_copy.h): streaming stores into memory the region holds
  // (faster than memcpy for a bucket the daemon reads next), pwrite on the
  // region's memfd into a slot the daemon discarded (no page fault per
  // 4 KiB). OutOfRange when the bytes do not fit the slot.
  absl::Status WriteGrad(uint32_t index, const void* src, uint64_t bytes, uint64_t offset = 0);
  // Waits until the daemon has taken every GradReady sent so far, returning
  // its refusal if it refused one. Immediate without the doorbell.
  absl::Status Flush();
  // Whether GradReady/WaitStep use the doorbell (the daemon offered one, and
  // ClientOptions::use_doorbell); set by RegisterTensors.
  bool doorbell_active() const;
  // Jobs with external_step_agreement: after the step's GradReady calls,
  // PrepareStep waits for every local rank's gradients and returns this
  // daemon's share; CommitStep hands back the all-reduced values, after which
  // WaitStep works as usual. The shares added in node order give the bits
  // one daemon holding every rank computes when there are 2^k nodes each
  // holding a contiguous, equal run of ranks (docs/DAEMON.md).
  absl::StatusOr<LocalStepStats> PrepareStep(uint64_t step);
  absl::Status CommitStep(uint64_t step, bool overflow, double squared_norm);
  absl::StatusOr<StepResult> WaitStep(uint64_t step);

  absl::Status Acquire(absl::Span<const uint32_t> indices);
  // As above, into `tier` (kPinnedHost: the window; kDevice: the daemon's
  // device arena, jobs with a device budget only), returning where each
  // shard sits now, in the order of `indices`.
  absl::StatusOr<std::vector<ShardPlace>> Acquire(absl::Span<const uint32_t> indices, TierKind tier);
  // The device arena, mapped once by RegisterTensors (kind kNone for a job
  // without a device budget or a daemon without a device tier).
  const DeviceArenaView& device_arena() const;
  // Why the arena is not mapped although the daemon offered it (a CUDA IPC
  // handle this process cannot open); OK otherwise.
  absl::Status device_error() const;
  // The bytes of a shard placed in the mapped emulated arena (kMemfd), or
  // of one in the window (kPinnedHost). OutOfRange when the place does not
  // lie inside the mapping; FailedPrecondition for a CUDA arena (read it
  // from device_arena().device + offset on the GPU).
  absl::StatusOr<absl::Span<const std::byte>> PlacedBytes(const ShardPlace& place) const;
  // Copies a placed shard's bytes into `dst` (dst.size() >= place.bytes)
  // wherever it sits: the window, the emulated arena, or GPU memory (a
  // device-to-host copy). For trainers that want host bytes either way.
  absl::Status ReadPlaced(const ShardPlace& place, absl::Span<std::byte> dst) const;
  absl::Status Release(absl::Span<const uint32_t> indices);
  absl::Status IterationBoundary();
  absl::Status Heartbeat();

  struct State;
  explicit RankSession(std::unique_ptr<State> state);

 private:
  std::unique_ptr<State> state_;
};

}  // namespace strata

#endif  // STRATA_CLIENT_STRATA_CLIENT_H_
