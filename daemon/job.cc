#include "daemon/job.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/status_macros.h"
#include "swap/aligned_buffer.h"
#include "swap/extent_store.h"

namespace strata {
namespace {

constexpr uint32_t kMaxGroups = StepBarrier::kMaxGroups;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace

absl::StatusOr<std::unique_ptr<Job>> Job::Create(uint64_t id, JobSettings settings, JobServices services) {
  if (services.optimizer == nullptr) return absl::InternalError("job created without a CPU optimizer");
  std::unique_ptr<JobDeviceArena> device_arena;
  if (settings.device_budget_bytes > 0 && services.device != nullptr) {
    // The job's own device memory, of its budget: shared with its trainers
    // only (a trainer never maps another job's params).
    STRATA_ASSIGN_OR_RETURN(device_arena, services.device->OpenJob(JobId(id), settings.device_budget_bytes));
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<StepPipeline> pipeline, MakeStepPipeline(id, settings, services));
  std::unique_ptr<Job> job(new Job(id, std::move(settings), services, std::move(pipeline)));
  job->device_arena_ = std::move(device_arena);
  if (job->workers_ == nullptr) {
    STRATA_ASSIGN_OR_RETURN(job->own_workers_, ThreadPoolExecutor::Create(1));
    job->workers_ = job->own_workers_.get();
  }
  return job;
}

Job::Job(uint64_t id, JobSettings settings, JobServices services, std::unique_ptr<StepPipeline> pipeline)
    : id_(id),
      settings_(std::move(settings)),
      services_(services),
      slot_dtypes_{settings_.param_dtype, settings_.grad_dtype},
      pipeline_(std::move(pipeline)),
      regions_(slot_dtypes_),
      scaler_(settings_.loss_scale),
      workers_(services.workers) {}

Job::~Job() {
  CloseDoorbells();
  Stop();
  // The cache's I/O thread reads into the ranks' exchange regions: stop it
  // before those are unmapped (members are destroyed after this body).
  pipeline_->CloseWindow();
  // Writes never committed (a failed step, a load or registration cut
  // short) must not be committed by anyone else later: drop them.
  if (pipeline_->durable()) {
    absl::MutexLock lock(&commit_mu_);
    if (superseded_) return;  // the shards are its replacement's now
    services_.nvme->Rollback(id_);
    if (retired_) (void)services_.nvme->DeleteOwner(id_);  // writes that raced the delete
  }
}

bool Job::NeedsReload() const {
  absl::MutexLock lock(&mu_);
  return reload_needed_;
}

void Job::Supersede() {
  Stop();
  // The reloaded copy of this job takes its shards' place in the daemon's
  // param store (same keys): this one's leave it first.
  if (ParamCache* params = pipeline_->params(); params != nullptr) params->Detach();
  absl::MutexLock states_lock(&states_mu_);  // a pass in progress (InitParams) ends first
  absl::MutexLock lock(&commit_mu_);
  if (superseded_ || !pipeline_->durable()) return;
  services_.nvme->Rollback(id_);
  superseded_ = true;
}

void Job::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  changed_.SignalAll();
  PublishDoorbellsLocked();
  // Queued work finishes first: a step whose gradients are all in is applied
  // (graceful shutdown finishes in-flight steps). Once no turn is left, none
  // is scheduled again, so the pool never calls into a destroyed job.
  while (turn_scheduled_) changed_.Wait(&mu_);
  stopped_ = true;
}

bool Job::registered() const {
  absl::MutexLock lock(&mu_);
  return registered_;
}

uint64_t Job::next_step() const {
  absl::MutexLock lock(&mu_);
  return barrier_.next_step();
}

double Job::loss_scale() const {
  absl::MutexLock lock(&mu_);
  return scaler_.scale();
}

JobCounters Job::counters() const {
  JobCounters c;
  {
    absl::MutexLock lock(&mu_);
    c = counters_;
    c.pinned_reserved_bytes = pipeline_->pinned_bytes();
    for (const RankState& r : ranks_) {
      c.pinned_reserved_bytes += r.pinned.bytes();
      if (pipeline_->windowed() && r.built) c.window_resident_bytes += r.exchange.ResidentBytes().value_or(0);
    }
    pipeline_->CountLocked(mu_, c);
    if (states_ != nullptr) c.staging = states_->staging();
  }
  c.params = pipeline_->param_stats();
  return c;
}

uint64_t Job::params() const {
  uint64_t total = 0;
  for (const TensorSpec& t : tensors_) total += t.numel;
  return total;
}

const RequestLimits& Job::Limits() const {
  static const RequestLimits kDefaults;
  return services_.limits != nullptr ? *services_.limits : kDefaults;
}

absl::Status Job::BuildLayoutsLocked(const std::vector<TensorSpec>& tensors, bool adopt,
                                     const std::vector<std::vector<ShardLayout>>* supplied) {
  // Validated here, where every path that builds a job meets (RegisterTensors,
  // LoadCheckpoint's manifest, the NVMe record at restart).
  const RequestLimits& limits = Limits();
  STRATA_RETURN_IF_ERROR(ValidateTensorList(limits, tensors));
  if (settings_.world_size > limits.max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat("world_size ", settings_.world_size, " exceeds max_world_size (",
                                                   limits.max_world_size, ")"));
  }
  // The partition holds a layout per rank and tensor: bound its size too.
  constexpr uint64_t kMaxShardLayouts = uint64_t{1} << 22;
  if (uint64_t{settings_.world_size} * tensors.size() > kMaxShardLayouts) {
    return absl::ResourceExhaustedError(absl::StrCat("world_size ", settings_.world_size, " x ", tensors.size(),
                                                     " tensors is more than ", kMaxShardLayouts, " shards"));
  }
  PartitionSpec spec;
  spec.stage = settings_.stage;
  spec.world_size = settings_.world_size;
  spec.tensors = tensors;
  STRATA_RETURN_IF_ERROR(ValidatePartitionSpec(spec));
  const StateLayout state_layout = StateLayoutFor(settings_.optimizer);
  const uint64_t align = AlignmentElements(spec.alignment_bytes);
  // The shards of each local rank this call builds.
  std::vector<std::optional<std::vector<ShardLayout>>> to_build(settings_.world_size);
  if (supplied == nullptr) {
    // The optimizer states' partition decides what each rank's daemon-side
    // shards hold (stage 1/2: one flat shard cut into sub-groups; stage 3:
    // one shard per tensor).
    STRATA_ASSIGN_OR_RETURN(std::vector<RankLayout> layouts, PartitionState(spec, StateClass::kOptimizerStates));
    for (uint32_t r = 0; r < settings_.world_size; ++r) {
      if (!settings_.IsLocal(r)) continue;
      if (settings_.stage != 3) {
        const ShardLayout& flat = layouts[r].shards.at(0);
        const uint64_t size = std::max<uint64_t>(
            RoundUp(std::min(std::max<uint64_t>(settings_.sub_group_size, 1), std::max<uint64_t>(flat.padded_numel, 1)),
                    align),
            align);
        const uint64_t groups = flat.padded_numel / size + (flat.padded_numel % size != 0);
        if (groups > limits.max_tensors_per_job) {
          return absl::InvalidArgumentError(absl::StrCat(
              "zero_optimization.sub_group_size ", settings_.sub_group_size, " cuts rank ", r, "'s shard of ",
              flat.padded_numel, " elements into ", groups, " sub-groups; at most max_tensors_per_job (",
              limits.max_tensors_per_job, ") are allowed"));
        }
        to_build[r] = SplitSubGroups(flat, settings_.sub_group_size, align);
      } else {
        to_build[r] = layouts[r].shards;
      }
    }
  } else {
    for (uint32_t r = 0; r < supplied->size() && r < settings_.world_size; ++r) {
      if (settings_.IsLocal(r) && !(*supplied)[r].empty()) to_build[r] = (*supplied)[r];
    }
  }
  // NVMe staging: tiles of at most io_tile_bytes, but no bigger than the
  // job's largest shard (a one-element job stages 4 KiB tiles, not 64 MiB).
  uint64_t largest_shard = 0;
  for (const auto& shards : to_build) {
    if (!shards) continue;
    for (const ShardLayout& shard : *shards) largest_shard = std::max(largest_shard, shard.padded_numel);
  }
  STRATA_ASSIGN_OR_RETURN(const uint64_t largest_bytes, CheckedMul(largest_shard, 4, "largest shard bytes"));
  const uint64_t tile_bytes =
      std::min<uint64_t>(services_.io_tile_bytes, std::max<uint64_t>(RoundUp(largest_bytes, 4096), 4096));
  STRATA_ASSIGN_OR_RETURN(states_, pipeline_->MakeStates(state_layout, tile_bytes));
  ranks_.resize(settings_.world_size);
  for (uint32_t r = 0; r < settings_.world_size; ++r) {
    if (!settings_.IsLocal(r)) {
      // Served by another daemon: no slots, no states, nothing to wait for.
      ranks_[r].initialized = true;
    }
  }
  for (uint32_t r = 0; r < settings_.world_size; ++r) {
    if (to_build[r]) STRATA_RETURN_IF_ERROR(BuildRankLocked(r, std::move(*to_build[r]), adopt));
  }
  std::vector<const std::vector<ExchangeSlot>*> built;
  for (const RankState& rank : ranks_) {
    if (rank.built) built.push_back(&rank.slots);
  }
  STRATA_RETURN_IF_ERROR(pipeline_->OpenWindow(built, &regions_, workers_, [this] { RollbackUncommitted(); }));
  return absl::OkStatus();
}


absl::Status Job::BuildRankLocked(uint32_t r, std::vector<ShardLayout> shards, bool adopt) {
  RankState& rank = ranks_[r];
  const RequestLimits& limits = Limits();
  const StateLayout state_layout = StateLayoutFor(settings_.optimizer);
  // Sizes may come from a trainer: every product and sum is checked, and the
  // whole footprint is known (and refused, when too big) before anything is
  // allocated.
  STRATA_ASSIGN_OR_RETURN(ExchangeLayout layout, LayOutExchange(std::move(shards), slot_dtypes_, group_of_));
  STRATA_ASSIGN_OR_RETURN(const uint64_t pinned_bytes, pipeline_->RankPinnedBytes(r, layout, state_layout));
  const uint64_t region_bytes = layout.region_bytes;
  if (region_bytes > limits.max_region_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("rank ", r, "'s exchange region would be ", region_bytes,
                                                     " bytes; max_region_bytes is ", limits.max_region_bytes));
  }
  // A windowed region has memory only for the slots in use, within the
  // job's budget, which the pipeline reserves once for the job.
  const bool window = pipeline_->windowed();
  if (services_.pinned != nullptr && pinned_bytes > 0) {
    STRATA_ASSIGN_OR_RETURN(rank.pinned, services_.pinned->Reserve(pinned_bytes, absl::StrCat("job '", settings_.name,
                                                                                             "' rank ", r)));
  }
  STRATA_RETURN_IF_ERROR(rank.Map(std::move(layout), absl::StrCat("strata-job", id_, "-rank", r), !window));
  barrier_.AddRank(r, settings_.world_size, rank.slots.size());
  pipeline_->AddRankLocked(mu_, r, settings_.world_size, rank.slots.size());
  for (const ExchangeSlot& slot : rank.slots) {
    STRATA_RETURN_IF_ERROR(adopt ? states_->Adopt(r, slot.layout.index, slot.layout.padded_numel)
                                 : states_->Create(r, slot.layout.index, slot.layout.padded_numel));
  }
  rank.built = true;
  regions_.Publish(r, ranks_.size(), rank);
  return absl::OkStatus();
}

absl::Status Job::AdmitPartitionLocked(uint32_t rank, const std::vector<ShardLayout>& shards) {
  // Padding is the trainer's business, but a shard may not be larger than the
  // model plus an alignment's worth per tensor (saturating: sizes come from
  // the trainer).
  uint64_t max_padded = 4096;
  for (const TensorSpec& t : tensors_) {
    if (__builtin_add_overflow(max_padded, t.numel, &max_padded) ||
        __builtin_add_overflow(max_padded, uint64_t{4096}, &max_padded)) {
      max_padded = UINT64_MAX;
      break;
    }
  }
  if (shards.size() > (1u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("partition of rank ", rank, " has ", shards.size(),
                                                   " shards; at most ", 1u << 20, " are allowed"));
  }
  std::vector<std::map<uint64_t, std::pair<uint64_t, uint32_t>>> owned = owned_;
  owned.resize(tensors_.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const ShardLayout& shard = shards[i];
    const std::string where = absl::StrCat("partition of rank ", rank, ", shard ", i);
    if (shard.index != i) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " has index ", shard.index, "; shard i must have index i"));
    }
    if (shard.padded_numel == 0 || shard.padded_numel > max_padded) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": padded_numel ", shard.padded_numel,
                                                     " is not in 1..", max_padded));
    }
    uint64_t shard_end = 0;  // ranges must be sorted by shard_offset and disjoint
    for (size_t k = 0; k < shard.ranges.size(); ++k) {
      const OwnedRange& r = shard.ranges[k];
      const std::string range = absl::StrCat(where, ", range ", k);
      const uint32_t t = r.tensor.value();
      if (t >= tensors_.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat(range, " names tensor ", t, "; there are ", tensors_.size()));
      }
      const uint64_t numel = tensors_[t].numel;
      if (r.numel == 0) return absl::InvalidArgumentError(absl::StrCat(range, " is empty"));
      if (r.tensor_offset > numel || r.numel > numel - r.tensor_offset) {
        return absl::InvalidArgumentError(absl::StrCat(range, " covers elements [", r.tensor_offset, ", +", r.numel,
                                                       ") of tensor ", t, " ('", tensors_[t].name, "'), which has ",
                                                       numel));
      }
      if (r.shard_offset > shard.padded_numel || r.numel > shard.padded_numel - r.shard_offset) {
        return absl::InvalidArgumentError(absl::StrCat(range, " at shard offset ", r.shard_offset, " with ", r.numel,
                                                       " elements overruns the shard's ", shard.padded_numel));
      }
      if (r.shard_offset < shard_end) {
        return absl::InvalidArgumentError(absl::StrCat(
            range, " starts at shard offset ", r.shard_offset,
            ", inside the range before it (ranges must be sorted by shard_offset and disjoint)"));
      }
      shard_end = r.shard_offset + r.numel;
      // No element of the tensor may be owned twice, by this rank or another.
      auto& runs = owned[t];
      const uint64_t lo = r.tensor_offset, hi = r.tensor_offset + r.numel;
      auto next = runs.lower_bound(lo);
      const bool hits_next = next != runs.end() && next->first < hi;
      const bool hits_prev = next != runs.begin() && std::prev(next)->second.first > lo;
      if (hits_next || hits_prev) {
        const auto& other = hits_next ? *next : *std::prev(next);
        return absl::InvalidArgumentError(absl::StrCat(
            range, " owns elements [", lo, ", ", hi, ") of tensor ", t, " ('", tensors_[t].name,
            "'), overlapping [", other.first, ", ", other.second.first, ") owned by rank ", other.second.second));
      }
      runs.emplace(lo, std::make_pair(hi, rank));
    }
  }
  // Once every rank's partition is known, every element must be owned.
  bool complete = settings_.local_ranks.empty() || settings_.local_ranks.size() == settings_.world_size;
  for (uint32_t r = 0; r < ranks_.size() && complete; ++r) complete = r == rank || ranks_[r].built;
  if (complete) {
    for (uint32_t t = 0; t < tensors_.size(); ++t) {
      uint64_t cursor = 0;
      for (const auto& [lo, run] : owned[t]) {
        if (lo != cursor) break;
        cursor = run.first;
      }
      if (cursor != tensors_[t].numel) {
        auto next = owned[t].upper_bound(cursor);
        const uint64_t gap_end = next == owned[t].end() ? tensors_[t].numel : next->first;
        return absl::InvalidArgumentError(absl::StrCat(
            "with rank ", rank, "'s partition every rank has registered, but elements [", cursor, ", ", gap_end,
            ") of tensor ", t, " ('", tensors_[t].name, "') are owned by no rank"));
      }
    }
  }
  owned_ = std::move(owned);
  return absl::OkStatus();
}

absl::Status Job::AdmitRecordedPartitionsLocked(const std::vector<std::vector<ShardLayout>>& partitions) {
  // The record is a file on disk: its partitions get the checks a trainer's
  // would (tensor indices, bounds, order, no element owned twice) before
  // anything is laid out from them.
  if (partitions.size() != settings_.world_size) {
    return absl::DataLossError(absl::StrCat("the record of job '", settings_.name, "' has partitions for ",
                                            partitions.size(), " ranks; the job has ", settings_.world_size));
  }
  ranks_.resize(settings_.world_size);  // AdmitPartitionLocked looks at which ranks are built (none yet)
  for (uint32_t r = 0; r < settings_.world_size; ++r) {
    if (!settings_.IsLocal(r) || partitions[r].empty()) continue;
    if (absl::Status s = AdmitPartitionLocked(r, partitions[r]); !s.ok()) {
      return absl::DataLossError(absl::StrCat("the record of job '", settings_.name, "': ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Job::AdoptTensorsLocked(const JobRecord& record) {
  if (record.groups.size() != record.tensors.size()) {
    return absl::DataLossError(absl::StrCat("the record of job '", settings_.name, "' has ", record.groups.size(),
                                            " group indices for ", record.tensors.size(), " tensors"));
  }
  uint32_t largest = 0;
  for (uint32_t g : record.groups) {
    if (g >= kMaxGroups) {
      return absl::DataLossError(absl::StrCat("the record of job '", settings_.name, "' has group index ", g));
    }
    largest = std::max(largest, g);
  }
  tensors_ = record.tensors;
  group_of_ = record.groups;
  num_groups_ = largest + 1;
  return absl::OkStatus();
}

std::vector<OptimizerHyperparams> Job::HyperparamsLocked() const {
  return barrier_.Hyperparams(num_groups_, settings_.optimizer);
}

absl::Status Job::BeginStep(uint64_t step, const std::vector<GroupHyperparams>& groups) {
  absl::MutexLock lock(&mu_);
  if (!registered_) return absl::FailedPreconditionError("BeginStep before RegisterTensors");
  return barrier_.Begin(step, groups, num_groups_, settings_.optimizer);
}

absl::Status Job::Register(uint32_t rank, const std::vector<TensorSpec>& tensors,
                           const std::vector<uint32_t>& groups_in, const std::vector<ShardLayout>& partition) {
  absl::MutexLock lock(&mu_);
  if (rank < settings_.world_size && !settings_.IsLocal(rank)) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of job '", settings_.name,
                                                   "' is served by another daemon"));
  }
  std::vector<uint32_t> groups = groups_in.empty() ? std::vector<uint32_t>(tensors.size(), 0) : groups_in;
  if (groups.size() != tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat("RegisterTensors: ", groups.size(), " group indices for ",
                                                   tensors.size(), " tensors"));
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i] >= kMaxGroups) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", i, " ('", tensors[i].name, "') has group ",
                                                     groups[i], "; group indices must be below ", kMaxGroups));
    }
  }
  if (rank >= settings_.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is out of range for job '", settings_.name, "' of world size ",
                     settings_.world_size));
  }
  if (tensors.empty()) return absl::InvalidArgumentError("RegisterTensors: no tensors given");
  if (registered_ && rank < ranks_.size() && ranks_[rank].built && pipeline_->windowed()) {
    // A re-attached rank (its process restarted) is about to map the window
    // and write gradients again. Gradients its previous process sent may
    // still be inspected and spilled, and a spill ends by discarding the
    // slot: let those finish first, or the discard could zero what the new
    // process writes. Inspections take milliseconds to a few seconds.
    constexpr absl::Duration kQuiesceTimeout = absl::Minutes(2);
    if (!mu_.AwaitWithTimeout(absl::Condition(+[](uint32_t* work) { return *work == 0; }, &ranks_[rank].grad_work),
                              kQuiesceTimeout)) {
      return absl::UnavailableError(absl::StrCat("rank ", rank, " of job '", settings_.name,
                                                 "': its previous process's gradients are still being taken in "
                                                 "after ", absl::FormatDuration(kQuiesceTimeout), "; register again"));
    }
  }
  if (!registered_) {
    tensors_ = tensors;
    group_of_ = groups;
    num_groups_ = 1 + *std::max_element(groups.begin(), groups.end());
    supplied_ = !partition.empty();
    absl::Status s;
    if (supplied_) {
      supplied_partitions_.assign(settings_.world_size, {});
      ranks_.resize(settings_.world_size);  // AdmitPartitionLocked looks at which ranks are built
      s = AdmitPartitionLocked(rank, partition);
      if (s.ok()) {
        supplied_partitions_[rank] = partition;
        s = BuildLayoutsLocked(tensors, /*adopt=*/false, &supplied_partitions_);
      }
    } else {
      s = BuildLayoutsLocked(tensors, /*adopt=*/false);
    }
    if (!s.ok()) {
      tensors_.clear();
      group_of_.clear();
      supplied_ = false;
      supplied_partitions_.clear();
      owned_.clear();
      for (uint32_t r = 0; r < ranks_.size(); ++r) {
        barrier_.DropRank(r);
        pipeline_->DropRankLocked(mu_, r);
      }
      ranks_.clear();
      regions_.Clear();
      pipeline_->CloseWindow();
      states_.reset();
      pipeline_->ReleasePinned();
      return s;
    }
    registered_ = true;
    return absl::OkStatus();
  }
  if (tensors.size() != tensors_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " registers ", tensors.size(),
                                                   " tensors but the job has ", tensors_.size()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].name != tensors_[i].name || tensors[i].numel != tensors_[i].numel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " registers tensor ", i, " as '", tensors[i].name, "' (", tensors[i].numel,
          " elements) but the job has '", tensors_[i].name, "' (", tensors_[i].numel, " elements)"));
    }
    if (groups[i] != group_of_[i]) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " puts tensor ", i, " ('", tensors[i].name,
                                                     "') in group ", groups[i], " but the job has it in group ",
                                                     group_of_[i]));
    }
  }
  if (supplied_ != !partition.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank,
        partition.empty() ? " sends no partition but the job's ranks supply their own"
                          : " sends a partition but the job's first rank let the daemon partition",
        "; every rank must do the same"));
  }
  if (!supplied_) return absl::OkStatus();
  if (ranks_[rank].built) {
    // A re-attached rank registers again: the same partition.
    const std::vector<ShardLayout>& have = supplied_partitions_[rank];
    bool same = have.size() == partition.size();
    for (size_t i = 0; same && i < have.size(); ++i) {
      same = have[i].index == partition[i].index && have[i].padded_numel == partition[i].padded_numel &&
             have[i].ranges.size() == partition[i].ranges.size();
      for (size_t k = 0; same && k < have[i].ranges.size(); ++k) {
        const OwnedRange& a = have[i].ranges[k];
        const OwnedRange& b = partition[i].ranges[k];
        same = a.tensor == b.tensor && a.tensor_offset == b.tensor_offset && a.numel == b.numel &&
               a.shard_offset == b.shard_offset;
      }
    }
    if (!same) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", rank, " registers a partition other than the one it registered before"));
    }
    return absl::OkStatus();
  }
  STRATA_RETURN_IF_ERROR(AdmitPartitionLocked(rank, partition));
  supplied_partitions_[rank] = partition;
  absl::Status s = BuildRankLocked(rank, partition, /*adopt=*/false);
  if (!s.ok()) {
    ranks_[rank] = RankState{};
    barrier_.DropRank(rank);
    pipeline_->DropRankLocked(mu_, rank);
    supplied_partitions_[rank].clear();
    for (auto& runs : owned_) {
      for (auto it = runs.begin(); it != runs.end();) it = it->second.second == rank ? runs.erase(it) : std::next(it);
    }
  }
  return s;
}

std::vector<ExchangeSlot> Job::SlotsOf(uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  return ranks_.at(rank).slots;
}

int Job::ExchangeFdOf(uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  return ranks_.at(rank).exchange.fd();
}

uint64_t Job::ExchangeBytesOf(uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  return ranks_.at(rank).exchange.size_bytes();
}

uint64_t Job::InitBatchBytes() const {
  absl::MutexLock lock(&mu_);  // the window opens under it
  return pipeline_->InitBatchBytes();
}

absl::Status Job::InitParams(uint32_t rank, absl::Span<const uint32_t> indices) {
  std::vector<ExchangeSlot> slots;
  {
    absl::MutexLock lock(&mu_);
    if (!registered_) return absl::FailedPreconditionError("InitParams before RegisterTensors");
    if (!worker_error_.ok()) return worker_error_;
    if (barrier_.next_step() > 0 || optimizer_steps_ > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", settings_.name, "' has already taken steps; a re-attached rank keeps its state "
          "and must not initialize params again"));
    }
    slots = ranks_[rank].slots;
  }
  // The shards to initialize: the ones named (checked: they come from the
  // trainer), else all of them.
  std::vector<ShardId> ids;
  if (indices.empty()) {
    for (const ExchangeSlot& slot : slots) ids.push_back(ShardId{rank, slot.layout.index});
  } else {
    std::vector<bool> named(slots.size(), false);
    for (const uint32_t index : indices) {
      if (index >= slots.size()) {
        return absl::InvalidArgumentError(absl::StrCat("InitParams: shard index ", index, " is out of range: rank ",
                                                       rank, " has ", slots.size(), " shards"));
      }
      if (named[index]) {
        return absl::InvalidArgumentError(
            absl::StrCat("InitParams: shard index ", index, " is listed twice; name each shard once"));
      }
      named[index] = true;
      ids.push_back(ShardId{rank, index});
    }
  }
  CpuOptimizer* opt = services_.optimizer;
  const OptimizerHyperparams& hp = settings_.optimizer;
  absl::MutexLock states_lock(&states_mu_);
  STRATA_RETURN_IF_ERROR(states_->Update(ids, [&](const ShardId& id, const StateTile& tile) -> absl::Status {
    const ExchangeSlot& slot = slots[id.index];
    const std::byte* src = regions_.ParamSlot(rank, slot) + tile.offset * DTypeSize(settings_.param_dtype);
    STRATA_RETURN_IF_ERROR(opt->ConvertToFp32(src, settings_.param_dtype, tile.master, tile.size));
    StepSpans spans;
    spans.size = tile.size;
    spans.params = tile.master;
    spans.exp_avg = tile.exp_avg;
    spans.exp_avg_sq = tile.exp_avg_sq;
    spans.max_exp_avg_sq = tile.max_exp_avg_sq;
    spans.grad = regions_.GradSlot(rank, slot);
    spans.grad_dtype = settings_.grad_dtype;
    STRATA_RETURN_IF_ERROR(opt->InitializeState(hp, spans));
    // The pipeline takes each shard's params once read (Infinity: home to
    // NVMe; with a budget the slot is emptied for the trainer's next batch).
    if (tile.offset + tile.size == slot.layout.padded_numel) {
      STRATA_RETURN_IF_ERROR(pipeline_->ParamsInitialized(rank, slot.layout.index));
    }
    return absl::OkStatus();
  }));
  std::string record;
  {
    absl::MutexLock lock(&mu_);
    RankState& r = ranks_[rank];
    r.shard_initialized.resize(slots.size(), false);
    for (const ShardId& id : ids) r.shard_initialized[id.index] = true;
    // Once initialized, a rank stays so (a shard sent again before the first
    // step is just initialized again; a restored job has no per-shard list).
    r.initialized = r.initialized || std::find(r.shard_initialized.begin(), r.shard_initialized.end(), false) ==
                                         r.shard_initialized.end();
    if (!r.initialized) return absl::OkStatus();
    bool all = true;
    for (const RankState& other : ranks_) all = all && other.initialized;
    if (all) PublishDoorbellsLocked();  // gradients are accepted from now on
    if (!all || !pipeline_->durable()) return absl::OkStatus();
    record = SerializeJobRecord(RecordLocked());
  }
  return CommitWithRecord(record);
}

absl::Status Job::GradReady(uint32_t rank, uint32_t index, uint64_t step) {
  absl::MutexLock lock(&mu_);
  if (!registered_) return absl::FailedPreconditionError("GradReady before RegisterTensors");
  RankState& r = ranks_[rank];
  if (index >= r.slots.size()) {
    return absl::OutOfRangeError(absl::StrCat("shard index ", index, " is out of range: rank ", rank,
                                              " has ", r.slots.size(), " shards"));
  }
  for (uint32_t i = 0; i < ranks_.size(); ++i) {
    if (!ranks_[i].initialized) {
      return absl::FailedPreconditionError(absl::StrCat(
          "GradReady before every rank called InitParams (rank ", i, " has not)"));
    }
  }
  if (!worker_error_.ok()) return worker_error_;
  // A duplicate (see StepBarrier::Accept) changes nothing.
  STRATA_ASSIGN_OR_RETURN(const bool taken, barrier_.Accept(rank, index, step));
  if (!taken) return absl::OkStatus();
  if (!grads_in_start_.has_value()) {
    grads_in_start_ = absl::Now();  // the open step's first gradient
    // The step's state loads need no gradient: the first tiles come in
    // while the rest of the gradients do.
    // (Not where shards are stepped early: those come first, in the order
    // their gradients do.)
    if (pipeline_->durable() && !pipeline_->early_apply()) queue_.push_back(WorkItem{WorkItem::kPreload, 0, 0});
  }
  pipeline_->GradArrivedLocked(mu_, rank, index, r.slots[index]);
  PublishGradWindowLocked(rank);
  // Sending a gradient again replaces it: inspect the new contents.
  if (inspect_queued_.insert({rank, index}).second) {
    queue_.push_back(WorkItem{WorkItem::kInspect, rank, index});
    ++r.grad_work;
  }
  if (barrier_.complete()) {
    if (settings_.external_step_agreement) {
      // The step waits for CommitStep; PrepareStep gets this daemon's share.
      queue_.push_back(WorkItem{WorkItem::kPrepare, 0, 0});
    } else {
      barrier_.QueueStep();
      queue_.push_back(WorkItem{WorkItem::kRunStep, 0, 0});
    }
  }
  ScheduleLocked();
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<StepStats> Job::PrepareStep(uint64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (!settings_.external_step_agreement) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PrepareStep: job '", settings_.name, "' was not created with external_step_agreement"));
  }
  if (step > barrier_.next_step()) {
    return absl::FailedPreconditionError(
        absl::StrCat("PrepareStep for step ", step, " is too early; the job is at step ", barrier_.next_step()));
  }
  while (true) {
    if (const StepStats* prepared = barrier_.Prepared(step)) return *prepared;
    if (!worker_error_.ok()) return worker_error_;
    if (step < barrier_.next_step()) {
      return absl::NotFoundError(absl::StrCat("the local stats of step ", step, " are no longer kept"));
    }
    if (stopping_) return absl::UnavailableError("the daemon is stopping");
    if (changed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("PrepareStep ", step, " of job '", settings_.name,
                                                      "': ", barrier_.grads_missing(), " local gradients are still missing"));
    }
  }
}

absl::Status Job::CommitStep(uint64_t step, const StepStats& global) {
  absl::MutexLock lock(&mu_);
  if (!settings_.external_step_agreement) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CommitStep: job '", settings_.name, "' was not created with external_step_agreement"));
  }
  bool queued = false;
  STRATA_RETURN_IF_ERROR(barrier_.Commit(step, global, &queued));
  if (!queued) return absl::OkStatus();  // an equal commit again
  queue_.push_back(WorkItem{WorkItem::kRunStep, 0, 0});
  ScheduleLocked();
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> Job::WaitStep(uint64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (const StepOutcome* outcome = barrier_.Outcome(step)) return *outcome;
    if (!worker_error_.ok()) return worker_error_;
    if (step < barrier_.next_step()) {
      return absl::NotFoundError(absl::StrCat("the outcome of step ", step, " is no longer kept"));
    }
    if (stopping_) return absl::UnavailableError("the daemon is stopping");
    if (changed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "step ", step, " of job '", settings_.name, "' did not finish in time; ", barrier_.grads_missing(),
          " gradients are still missing"));
    }
  }
}

void Job::ScheduleLocked() {
  if (turn_scheduled_ || stopped_ || queue_.empty()) return;
  turn_scheduled_ = true;
  workers_->Schedule([this] { RunTurn(); });
}

void Job::RunTurn() {
  WorkItem item;
  {
    absl::MutexLock lock(&mu_);
    item = queue_.front();  // a turn is scheduled only with work queued
    queue_.pop_front();
  }
  RunItem(item);
  absl::MutexLock lock(&mu_);
  turn_scheduled_ = false;
  ScheduleLocked();      // the next item waits behind other jobs' turns
  changed_.SignalAll();  // Stop waits for the last turn
}

void Job::RunItem(const WorkItem& item) {
  if (item.kind == WorkItem::kInspect) Inspect(item.rank, item.index);
  if (item.kind == WorkItem::kRunStep) RunStep();
  if (item.kind == WorkItem::kPreload) PreloadStates();
  if (item.kind == WorkItem::kEarlySteps) RunEarlySteps();
  if (item.kind == WorkItem::kPrepare) {
    absl::MutexLock lock(&mu_);
    if (barrier_.PrepareOpenStep()) changed_.SignalAll();
  }
  if (item.kind == WorkItem::kInspect) {
    absl::MutexLock lock(&mu_);
    if (item.rank < ranks_.size() && ranks_[item.rank].grad_work > 0) --ranks_[item.rank].grad_work;
  }
}

void Job::Inspect(uint32_t rank, uint32_t index) {
  ExchangeSlot slot;
  {
    absl::MutexLock lock(&mu_);
    inspect_queued_.erase({rank, index});
    slot = ranks_[rank].slots[index];
  }
  GradView grad{regions_.GradSlot(rank, slot), settings_.grad_dtype, slot.layout.padded_numel};
  auto overflow = services_.optimizer->HasInfOrNan(grad);
  auto norm = services_.optimizer->SquaredL2Norm(grad);
  absl::MutexLock lock(&mu_);
  if (!overflow.ok() || !norm.ok()) {
    worker_error_ = !overflow.ok() ? overflow.status() : norm.status();
    changed_.SignalAll();
    PublishDoorbellsLocked();
    return;
  }
  barrier_.Inspected(rank, index, *overflow, *norm);
  // Infinity: keeps the window within its budget, maybe spilling this
  // gradient (mu_ is released while it is written).
  absl::Status fit = pipeline_->AfterInspectLocked(mu_, rank, index, slot);
  PublishGradWindowLocked(rank);
  if (!fit.ok()) {
    worker_error_ = absl::Status(
        fit.code(),
        absl::StrCat(fit.message(), "; nothing of step ", barrier_.next_step(), " of job '", settings_.name,
                     "' was committed (the job's NVMe state is its last commit). Attach its ranks again (Attach, "
                     "RegisterTensors, no InitParams) and resend step ", barrier_.next_step(), "'s gradients"));
    reload_needed_ = true;
    changed_.SignalAll();
    PublishDoorbellsLocked();
    return;
  }
  if (!pipeline_->early_apply() || barrier_.applied(rank, index)) return;
  // A durable job's states stream from NVMe: once every gradient is in, the
  // step's one pass over the rest is faster than a pass per shard.
  if (pipeline_->durable() && barrier_.complete()) return;
  // Clipping is off, so nothing global decides this shard's update but an
  // overflow, which skips the whole step (loss scaling): step it now, while
  // the trainers are still in backward, and (durable jobs) roll it back if
  // the step is skipped (RunStep). The gradient scale cannot change before
  // the step ends.
  if (pipeline_->durable()) {
    // In a pass with the other shards inspected meanwhile (RunEarlySteps).
    early_ready_.push_back(ShardId{rank, index});
    if (!early_steps_queued_) {
      early_steps_queued_ = true;
      queue_.push_back(WorkItem{WorkItem::kEarlySteps, 0, 0});
    }
    return;
  }
  std::optional<StepHooks> hooks = pipeline_->EarlyStepLocked(mu_, rank, index, slot, /*step_certain=*/false);
  if (!hooks.has_value()) return;
  barrier_.MarkApplied(rank, index);
  const std::vector<ShardId> ids = {ShardId{rank, index}};
  StepEarlyLocked(ShardList(ids), AllSlotsLocked(), *hooks);
}

void Job::RunEarlySteps() {
  absl::MutexLock lock(&mu_);
  // Every gradient is in already: the step (queued) takes them all in its pass.
  if (stopping_ || !worker_error_.ok() || reload_needed_ || barrier_.complete()) {
    early_steps_queued_ = false;
    early_ready_.clear();
    return;
  }
  // early_steps_queued_ stays set while the pass runs: the shards inspected
  // meanwhile join it (NextEarlyShardLocked) instead of queueing another.
  EarlyPass pass;
  pass.slots = AllSlotsLocked();
  // One set of hooks for the pass: each shard's own (taken as it joins).
  // pass outlives the pass's ApplyShards (StepEarlyLocked returns after it).
  auto of = [&pass](const ShardId& id) -> const StepHooks& { return pass.hooks.at({id.rank, id.index}); };
  StepHooks hooks;
  hooks.param_target = [this, &of, &pass](const ShardId& id) {
    const StepHooks& h = of(id);
    return h.param_target ? h.param_target(id) : regions_.ParamSlot(id.rank, pass.slots[id.rank][id.index]);
  };
  hooks.shard_done = [&of](const ShardId& id) {
    const StepHooks& h = of(id);
    return h.shard_done ? h.shard_done(id) : absl::OkStatus();
  };
  ShardSource next = [this, &pass](bool wait) -> std::optional<ShardId> {
    absl::MutexLock lock(&mu_);
    return NextEarlyShardLocked(pass, wait);
  };
  StepEarlyLocked(next, pass.slots, hooks);
  early_steps_queued_ = false;
}

std::optional<ShardId> Job::NextEarlyShardLocked(EarlyPass& pass, bool wait) {
  const absl::Time give_up = absl::Now() + services_.early_pass_wait;
  while (true) {
    if (stopping_ || !worker_error_.ok() || reload_needed_) return std::nullopt;
    while (!early_ready_.empty()) {
      const ShardId id = early_ready_.front();
      early_ready_.pop_front();
      if (TakeEarlyLocked(pass, id)) return id;
    }
    // This pass holds the job's turn: the inspections (and a PrepareStep's
    // stats) queued behind it run here, between its tiles, so the shards
    // they find ready join it.
    if (!queue_.empty() &&
        (queue_.front().kind == WorkItem::kInspect || queue_.front().kind == WorkItem::kPrepare)) {
      const WorkItem item = queue_.front();
      queue_.pop_front();
      mu_.Unlock();
      RunItem(item);
      mu_.Lock();
      continue;
    }
    // Every gradient is in and inspected: the pass goes on with the rest of
    // the step's shards (those whose gradients wait in their slots), so the
    // early shards and the step's are one stream; the step itself is left
    // with spilled gradients and the commit. Not when a gradient overflowed:
    // the step is skipped and the early shards rolled back.
    if (barrier_.complete() && inspect_queued_.empty()) {
      if (!pass.rest.has_value()) {
        pass.rest = barrier_.LocalStats().overflow ? std::vector<ShardId>() : StepShardsLocked();
      }
      // The step cannot be skipped now, unless other daemons' stats decide.
      const bool certain = !settings_.external_step_agreement;
      while (pass.next_rest < pass.rest->size()) {
        const ShardId id = (*pass.rest)[pass.next_rest++];
        if (TakeEarlyLocked(pass, id, certain)) return id;
      }
      return std::nullopt;
    }
    if (!wait || absl::Now() >= give_up) return std::nullopt;
    changed_.WaitWithDeadline(&mu_, give_up);
  }
}

bool Job::TakeEarlyLocked(EarlyPass& pass, const ShardId& id, bool step_certain) {
  if (id.rank >= ranks_.size() || id.index >= ranks_[id.rank].slots.size() ||
      barrier_.applied(id.rank, id.index)) {
    return false;
  }
  std::optional<StepHooks> hooks =
      pipeline_->EarlyStepLocked(mu_, id.rank, id.index, ranks_[id.rank].slots[id.index], step_certain);
  if (!hooks.has_value()) return false;
  barrier_.MarkApplied(id.rank, id.index);
  pass.hooks.insert_or_assign(std::make_pair(id.rank, id.index), std::move(*hooks));
  return true;
}

std::vector<std::vector<ExchangeSlot>> Job::AllSlotsLocked() const {
  std::vector<std::vector<ExchangeSlot>> slots;
  slots.reserve(ranks_.size());
  for (const RankState& r : ranks_) slots.push_back(r.slots);
  return slots;
}

void Job::StepEarlyLocked(const ShardSource& next, const std::vector<std::vector<ExchangeSlot>>& slots,
                          const StepHooks& hooks) {
  const int64_t optimizer_step = static_cast<int64_t>(optimizer_steps_) + 1;
  const float grad_scale = static_cast<float>(1.0 / scaler_.scale());
  const std::vector<OptimizerHyperparams> hp = HyperparamsLocked();
  mu_.Unlock();
  absl::Status status;
  uint64_t stepped = 0;
  StepTimes times;
  {
    const ShardSource counted = [&next, &stepped](bool wait) {
      std::optional<ShardId> id = next(wait);
      stepped += id.has_value() ? 1 : 0;
      return id;
    };
    absl::MutexLock states_lock(&states_mu_);
    status = ApplyShards(counted, slots, optimizer_step, grad_scale, hp, hooks, &times);
    // The pipeline's writes still running are the pass's (its error first).
    absl::Status ended = pipeline_->EndEarlyPass(/*failed=*/!status.ok());
    if (status.ok()) status = ended;
  }
  if (!status.ok() && pipeline_->durable()) RollbackUncommitted();
  mu_.Lock();
  if (!status.ok()) {
    const bool nvme = pipeline_->durable();
    worker_error_ = absl::Status(
        status.code(),
        absl::StrCat("optimizer step of job '", settings_.name, "' failed: ", status.message(),
                     nvme ? absl::StrCat("; nothing of step ", barrier_.next_step(), " was committed. Attach its "
                                         "ranks again (Attach, RegisterTensors, no InitParams) and resend step ",
                                         barrier_.next_step(), "'s gradients")
                          : std::string()));
    reload_needed_ = nvme;
    changed_.SignalAll();
    PublishDoorbellsLocked();
    return;
  }
  if (stepped == 0) return;
  open_step_early_times_.early_stream_s += times.stream_s;
  open_step_early_times_.early_load_wait_s += times.load_wait_s;
  open_step_early_times_.early_params_home_s += times.params_home_s;
  counters_.shards_stepped_early += stepped;
  ++counters_.early_passes;
  open_step_shards_early_ += stepped;
  ++open_step_early_passes_;
}

void Job::RollbackUncommitted() {
  absl::MutexLock commit_lock(&commit_mu_);
  if (!superseded_) services_.nvme->Rollback(id_);
}

absl::Status Job::ApplyShards(const ShardSource& next, const std::vector<std::vector<ExchangeSlot>>& slots,
                              int64_t optimizer_step, float grad_scale, const std::vector<OptimizerHyperparams>& hp,
                              const StepHooks& hooks, StepTimes* times) {
  const auto& shard_done = hooks.shard_done;
  const auto& grad_source = hooks.grad_source;
  const std::byte* shard_grad = nullptr;  // grad_source's answer for the shard being stepped
  std::byte* shard_params = nullptr;      // where the shard's new params go
  const bool sixteen_bit = settings_.param_dtype != DType::kFp32;
  const size_t psize = DTypeSize(settings_.param_dtype);
  const size_t gsize = DTypeSize(settings_.grad_dtype);
  // Adds the time since `from` to `*into` when the caller asked for times.
  using Clock = std::chrono::steady_clock;
  auto add_since = [times](Clock::time_point from, double StepTimes::*into) {
    if (times != nullptr) times->*into += std::chrono::duration<double>(Clock::now() - from).count();
  };
  const Clock::time_point pass_start = Clock::now();
  absl::Status status = states_->UpdateStream(next, [&](const ShardId& id, const StateTile& tile) -> absl::Status {
    const ExchangeSlot& slot = slots[id.rank][id.index];
    const uint64_t tile_end = tile.offset + tile.size;
    if (tile.offset == 0 || shard_params == nullptr) {
      shard_params = hooks.param_target ? hooks.param_target(id) : regions_.ParamSlot(id.rank, slot);
    }
    if (!grad_source) {
      shard_grad = regions_.GradSlot(id.rank, slot);
    } else if (tile.offset == 0) {
      const Clock::time_point t0 = Clock::now();
      absl::StatusOr<const std::byte*> grad = grad_source(id);
      add_since(t0, &StepTimes::grads_back_s);
      if (!grad.ok()) return grad.status();
      shard_grad = *grad;
    }
    // A tile (NVMe streams a shard in tiles) may span several groups' runs:
    // each piece is stepped with its group's hyperparameters. The kernels
    // are elementwise, so the cuts do not change a bit.
    for (const GroupRun& run : slot.group_runs) {
      const uint64_t lo = std::max(run.begin, tile.offset);
      const uint64_t hi = std::min(run.end, tile_end);
      if (lo >= hi) continue;
      const uint64_t rel = lo - tile.offset;
      auto at = [rel](float* p) { return p == nullptr ? nullptr : p + rel; };
      StepSpans spans;
      spans.size = hi - lo;
      spans.params = tile.master + rel;
      spans.exp_avg = at(tile.exp_avg);
      spans.exp_avg_sq = at(tile.exp_avg_sq);
      spans.max_exp_avg_sq = at(tile.max_exp_avg_sq);
      spans.grad = shard_grad + lo * gsize;
      spans.grad_dtype = settings_.grad_dtype;
      std::byte* param_out = shard_params + lo * psize;
      if (sixteen_bit) {
        spans.param_out = param_out;
        spans.param_out_dtype = settings_.param_dtype;
      }
      const Clock::time_point t0 = Clock::now();
      absl::Status stepped = services_.optimizer->Step(hp.at(run.group), optimizer_step, spans, grad_scale);
      add_since(t0, &StepTimes::optimizer_s);
      STRATA_RETURN_IF_ERROR(stepped);
      if (!sixteen_bit) std::memcpy(param_out, spans.params, spans.size * sizeof(float));
    }
    if (shard_done && tile_end == slot.layout.padded_numel) {
      const Clock::time_point t0 = Clock::now();
      absl::Status done = shard_done(id);
      add_since(t0, &StepTimes::params_home_s);
      // A stepped shard may free its gradient slot: the trainer may be waiting for that room.
      absl::MutexLock lock(&mu_);
      PublishGradWindowLocked(id.rank);
      return done;
    }
    return absl::OkStatus();
  });
  if (times != nullptr) {
    add_since(pass_start, &StepTimes::stream_s);
    const UpdateWaits waits = states_->last_update_waits();
    times->load_wait_s += waits.load_s;
    times->save_wait_s += waits.save_s;
  }
  return status;
}

std::vector<ShardId> Job::StepShardsLocked() const {
  std::vector<ShardId> ids;
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    for (const ExchangeSlot& s : ranks_[r].slots) {
      // Shards the early path already stepped (see Inspect) are done.
      if (!barrier_.applied(r, s.layout.index)) ids.push_back(ShardId{r, s.layout.index});
    }
  }
  return ids;
}

void Job::PreloadStates() {
  std::vector<ShardId> ids;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ || !worker_error_.ok() || reload_needed_) return;
    ids = StepShardsLocked();
  }
  absl::MutexLock states_lock(&states_mu_);
  if (states_ != nullptr) states_->Preload(ids);
}

void Job::RunStep() {
  const absl::Time start = absl::Now();
  StepTimes times;  // written by this thread only; published under mu_ at the end
  bool overflow = false;
  double squared = 0;
  double scale;
  bool scaler_enabled = false;
  uint64_t step;
  int64_t optimizer_step;
  std::vector<std::vector<ExchangeSlot>> slots;
  std::vector<OptimizerHyperparams> hp;
  {
    absl::MutexLock lock(&mu_);
    // A failed gradient spill (AfterInspectLocked) failed this step already:
    // nothing of it may be applied or committed; the job is reloaded.
    if (reload_needed_) return;
    if (grads_in_start_.has_value()) times.gradients_in_s = absl::ToDoubleSeconds(start - *grads_in_start_);
    times.shards_early = open_step_shards_early_;
    open_step_shards_early_ = 0;
    times.early_passes = open_step_early_passes_;
    open_step_early_passes_ = 0;
    times.early_stream_s = open_step_early_times_.early_stream_s;
    times.early_load_wait_s = open_step_early_times_.early_load_wait_s;
    times.early_params_home_s = open_step_early_times_.early_params_home_s;
    open_step_early_times_ = StepTimes();
    StepStats stats = barrier_.LocalStats();
    if (settings_.external_step_agreement) stats = barrier_.CommittedOpenStep();
    overflow = stats.overflow;
    squared = stats.squared_norm;
    scale = scaler_.scale();
    scaler_enabled = scaler_.enabled();
    step = barrier_.next_step();
    optimizer_step = static_cast<int64_t>(optimizer_steps_) + 1;
    slots = AllSlotsLocked();
    hp = HyperparamsLocked();
  }
  // Norms are of the scaled gradients; unscale before clipping, as DeepSpeed does.
  const double norm = std::sqrt(squared) / scale;
  const bool skip = overflow && scaler_enabled;
  absl::Status status;
  if (!skip) {
    double clip = 1.0;
    if (settings_.gradient_clipping > 0 && std::isfinite(norm)) {
      const double coef = settings_.gradient_clipping / (norm + 1e-6);
      if (coef < 1.0) clip = coef;
    }
    const float grad_scale = static_cast<float>(clip / scale);
    std::vector<ShardId> ids;
    {
      absl::MutexLock lock(&mu_);
      ids = StepShardsLocked();
    }
    absl::MutexLock states_lock(&states_mu_);
    StepHooks hooks = pipeline_->BeginStep(mu_, ids, slots);
    if (hooks.before_shards) {
      const absl::Time t0 = absl::Now();
      status = hooks.before_shards();
      times.params_home_s += absl::ToDoubleSeconds(absl::Now() - t0);
    }
    if (status.ok()) status = ApplyShards(ShardList(ids), slots, optimizer_step, grad_scale, hp, hooks, &times);
    // Before the commit: no spilled copy may become durable.
    const absl::Time end_start = absl::Now();
    pipeline_->EndStep(mu_);
    times.end_s = absl::ToDoubleSeconds(absl::Now() - end_start);
    if (status.ok() && pipeline_->durable()) {
      // The record that goes into the same commit says this step is done.
      std::string record;
      {
        absl::MutexLock lock(&mu_);
        JobRecord r = RecordLocked();
        LossScaler after = scaler_;
        after.Update(overflow);
        r.next_step = step + 1;
        r.optimizer_steps = optimizer_steps_ + 1;
        r.loss_scaler = after.state();
        record = SerializeJobRecord(r);
      }
      const absl::Time commit_start = absl::Now();
      status = CommitWithRecord(record);
      times.commit_s = absl::ToDoubleSeconds(absl::Now() - commit_start);
    }
  } else {
    // Shards stepped early were speculation on this step not overflowing:
    // their states (written to NVMe, not committed) go back to the last
    // commit; their new params never left their gradient slots.
    if (times.shards_early > 0 && pipeline_->durable()) RollbackUncommitted();
    pipeline_->SkipStep(mu_);  // a skipped step's gradients are not needed either
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!status.ok() && pipeline_->durable()) {
    // Nothing of the failed step may become durable (not even by the commit
    // of every owner at shutdown): back to the last committed step.
    RollbackUncommitted();
  }
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    const bool nvme = pipeline_->durable();
    worker_error_ = absl::Status(
        status.code(),
        absl::StrCat("optimizer step ", step, " of job '", settings_.name, "' failed: ", status.message(),
                     nvme ? absl::StrCat("; nothing of step ", step, " was committed (the job's NVMe state is its "
                                         "last commit: ", step == 0 ? std::string("its initial state")
                                         : absl::StrCat("the end of step ", step - 1), "). Attach its ranks "
                                         "again (Attach, RegisterTensors, no InitParams) and resend step ", step,
                                         "'s gradients; if the same shard fails again, the device is failing: "
                                         "restore the job from a checkpoint (LoadCheckpoint)")
                         : std::string()));
    reload_needed_ = nvme;
    grads_in_start_.reset();
    changed_.SignalAll();
    PublishDoorbellsLocked();
    return;
  }
  scaler_.Update(overflow);
  StepOutcome outcome;
  outcome.skipped = skip;
  outcome.grad_norm = norm;
  outcome.next_loss_scale = scaler_.scale();
  if (!skip) ++optimizer_steps_;
  outcome.optimizer_steps = optimizer_steps_;
  if (skip) ++counters_.steps_skipped;
  else ++counters_.steps_applied;
  counters_.last_step_s = seconds;
  counters_.total_step_s += seconds;
  {
    JobCounters spill;
    pipeline_->CountLocked(mu_, spill);
    times.grad_bytes_spilled = spill.grad_bytes_spilled - spilled_at_step_end_;
    times.grad_bytes_read_back = spill.grad_bytes_read_back - read_back_at_step_end_;
    spilled_at_step_end_ = spill.grad_bytes_spilled;
    read_back_at_step_end_ = spill.grad_bytes_read_back;
  }
  if (!skip) counters_.last_step = times;
  grads_in_start_.reset();  // the next step's first gradient starts its phase
  barrier_.Finish(step, outcome);
  PublishStepLocked(step, outcome);
  changed_.SignalAll();
}

ShardKey Job::RecordKey(uint64_t job_id) {
  return ShardKey{JobId(job_id), Rank(UINT32_MAX), TensorId(UINT32_MAX), TensorKind::kParam16, 0};
}

bool Job::IsRecordKey(const ShardKey& key) {
  return key.rank == Rank(UINT32_MAX) && key.tensor == TensorId(UINT32_MAX);
}

JobRecord Job::RecordLocked() const {
  JobRecord record;
  record.settings = JobSettingsToRequest(settings_);
  record.tensors = tensors_;
  record.next_step = barrier_.next_step();
  record.optimizer_steps = optimizer_steps_;
  record.loss_scaler = scaler_.state();
  record.groups = group_of_;
  record.group_hyperparams = barrier_.group_hyperparams();
  if (supplied_) record.partitions = supplied_partitions_;
  record.owner_uid = settings_.owner_uid;
  return record;
}

void Job::ApplyRecordLocked(const JobRecord& record) {
  for (RankState& rank : ranks_) rank.initialized = true;
  barrier_.Restore(record.next_step, record.group_hyperparams);
  optimizer_steps_ = record.optimizer_steps;
  scaler_ = LossScaler(settings_.loss_scale, record.loss_scaler);
}

absl::Status Job::WriteRecord(const std::string& record) {
  const uint32_t align = services_.nvme->alignment();
  STRATA_ASSIGN_OR_RETURN(AlignedBuffer buffer, AlignedBuffer::Allocate(record.size(), align));
  std::memcpy(buffer.data(), record.data(), record.size());
  return services_.nvme->Write(RecordKey(id_), absl::Span<const std::byte>(buffer.data(), record.size()));
}

absl::Status Job::CommitWithRecord(const std::string& record) {
  absl::MutexLock lock(&commit_mu_);
  if (superseded_) return absl::FailedPreconditionError(absl::StrCat("job '", settings_.name, "' was reloaded"));
  if (retired_) {
    services_.nvme->Rollback(id_);
    return absl::FailedPreconditionError(absl::StrCat("job '", settings_.name, "' was deleted"));
  }
  absl::Status s = WriteRecord(record);
  if (s.ok()) s = services_.nvme->Commit(id_);
  if (!s.ok()) services_.nvme->Rollback(id_);
  return s;
}

absl::Status Job::Retire() {
  if (!pipeline_->durable()) return absl::OkStatus();
  absl::MutexLock lock(&commit_mu_);
  retired_ = true;
  return services_.nvme->DeleteOwner(id_);
}

absl::StatusOr<std::unique_ptr<Job>> Job::Restore(uint64_t id, const std::string& text, JobServices services) {
  STRATA_ASSIGN_OR_RETURN(JobRecord record, ParseJobRecord(text, absl::StrCat("the NVMe record of job ", id)));
  STRATA_ASSIGN_OR_RETURN(JobSettings settings, ResolveJobSettings(record.settings));
  settings.owner_uid = record.owner_uid.value_or(0);  // no owner recorded: admins only
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, Create(id, std::move(settings), services));
  absl::MutexLock lock(&job->mu_);
  STRATA_RETURN_IF_ERROR(job->AdoptTensorsLocked(record));
  job->supplied_ = !record.partitions.empty();
  if (job->supplied_) STRATA_RETURN_IF_ERROR(job->AdmitRecordedPartitionsLocked(record.partitions));
  job->supplied_partitions_ = record.partitions;
  STRATA_RETURN_IF_ERROR(job->BuildLayoutsLocked(record.tensors, /*adopt=*/true,
                                                 job->supplied_ ? &job->supplied_partitions_ : nullptr));
  job->registered_ = true;
  job->ApplyRecordLocked(record);
  return job;
}

absl::Status Job::Acquire(uint32_t rank, const std::vector<uint32_t>& indices, absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    if (!registered_) return absl::FailedPreconditionError("Acquire before RegisterTensors");
    for (uint32_t index : indices) {
      if (index >= ranks_[rank].slots.size()) {
        return absl::OutOfRangeError(absl::StrCat("shard index ", index, " is out of range: rank ", rank,
                                                  " has ", ranks_[rank].slots.size(), " shards"));
      }
    }
    if (!ranks_[rank].initialized) return absl::FailedPreconditionError("Acquire before InitParams");
  }
  return pipeline_->Acquire(rank, indices, deadline);
}

absl::Status Job::Release(uint32_t rank, const std::vector<uint32_t>& indices) {
  return pipeline_->Release(rank, indices);
}

absl::Status Job::IterationBoundary(uint32_t rank) {
  pipeline_->IterationBoundary(rank);
  return absl::OkStatus();
}

void Job::DropPins(uint32_t rank) {
  pipeline_->DropPins(rank);
}

}  // namespace strata
