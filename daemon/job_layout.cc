// Job, part 2: how a job's tensors become shards, slots and an exchange
// window -- RegisterTensors (layouts built or adopted from the record, the
// partition a trainer supplies admitted against its limits) and InitParams.
// The job's lifecycle and step protocol are in job.cc, its turn in
// job_step.cc.
#include "daemon/job.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/status_macros.h"

namespace strata {
namespace {

constexpr uint32_t kMaxGroups = StepBarrier::kMaxGroups;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

}  // namespace

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

}  // namespace strata
