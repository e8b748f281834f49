#include "daemon/job.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/status_macros.h"
#include "daemon/host_shard_state_store.h"
#include "daemon/nvme_shard_state_store.h"
#include "swap/aligned_buffer.h"
#include "swap/extent_store.h"

namespace strata {
namespace {

constexpr uint64_t kPage = 4096;
// Param groups per job; torch models rarely have more than a handful.
constexpr uint32_t kMaxGroups = 4096;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// Splits a flat stage-1/2 shard into sub-groups of at most `sub_group`
// elements (a multiple of `align`), so each can be stepped as soon as its
// gradient arrives.
std::vector<ShardLayout> SplitSubGroups(const ShardLayout& flat, uint64_t sub_group, uint64_t align) {
  // Clamped to the shard first: a sub_group_size near 2^64 must not wrap.
  sub_group = std::min(std::max<uint64_t>(sub_group, 1), std::max<uint64_t>(flat.padded_numel, 1));
  const uint64_t size = std::max<uint64_t>(RoundUp(sub_group, align), align);
  std::vector<ShardLayout> out;
  for (uint64_t begin = 0; begin < flat.padded_numel; begin += size) {
    const uint64_t end = std::min(begin + size, flat.padded_numel);
    ShardLayout part;
    part.index = static_cast<uint32_t>(out.size());
    part.padded_numel = end - begin;
    for (const OwnedRange& r : flat.ranges) {
      const uint64_t lo = std::max(r.shard_offset, begin);
      const uint64_t hi = std::min(r.shard_offset + r.numel, end);
      if (lo >= hi) continue;
      part.ranges.push_back(OwnedRange{r.tensor, r.tensor_offset + (lo - r.shard_offset), hi - lo, lo - begin});
    }
    out.push_back(std::move(part));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Job>> Job::Create(uint64_t id, JobSettings settings, JobServices services) {
  if (services.optimizer == nullptr) return absl::InternalError("job created without a CPU optimizer");
  if (settings.mode == strata::v1::MODE_INFINITY && services.nvme == nullptr) {
    return absl::FailedPreconditionError(
        "MODE_INFINITY needs the NVMe tier, and this daemon has none: start stratad with --nvme_path DIR");
  }
  std::unique_ptr<Job> job(new Job(id, std::move(settings), services));
  if (job->workers_ == nullptr) {
    STRATA_ASSIGN_OR_RETURN(job->own_workers_, ThreadPoolExecutor::Create(1));
    job->workers_ = job->own_workers_.get();
  }
  return job;
}

Job::Job(uint64_t id, JobSettings settings, JobServices services)
    : id_(id),
      settings_(std::move(settings)),
      services_(services),
      early_apply_(settings_.mode == strata::v1::MODE_OFFLOAD && !settings_.loss_scale.enabled &&
                   settings_.gradient_clipping <= 0),
      scaler_(settings_.loss_scale),
      workers_(services.workers) {}

Job::~Job() {
  CloseDoorbells();
  Stop();
  // The cache's I/O thread reads into the ranks' exchange regions: stop it
  // before those are unmapped (members are destroyed after this body).
  param_cache_.reset();
  // Writes never committed (a failed step, a load or registration cut
  // short) must not be committed by anyone else later: drop them.
  if (services_.nvme != nullptr && settings_.mode == strata::v1::MODE_INFINITY) {
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
  if (param_cache_ != nullptr) param_cache_->Detach();
  absl::MutexLock states_lock(&states_mu_);  // a pass in progress (InitParams) ends first
  absl::MutexLock lock(&commit_mu_);
  if (superseded_ || services_.nvme == nullptr || settings_.mode != strata::v1::MODE_INFINITY) return;
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
  return next_step_;
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
    c.pinned_reserved_bytes = pinned_reservation_.bytes() + window_reservation_.bytes();
    for (const RankState& r : ranks_) {
      c.pinned_reserved_bytes += r.pinned.bytes();
      if (param_cache_ != nullptr && r.built) c.window_resident_bytes += r.exchange.ResidentBytes().value_or(0);
    }
    if (param_cache_ != nullptr) c.window_budget_bytes = param_budget_;
  }
  if (param_cache_ != nullptr) c.params = param_cache_->stats();
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
  if (settings_.mode == strata::v1::MODE_INFINITY) {
    const uint64_t streams = 1 + state_layout.exp_avg + state_layout.exp_avg_sq + state_layout.max_exp_avg_sq;
    const uint64_t tile_elements = std::max<uint64_t>(tile_bytes / 4 / 1024 * 1024, 1024);
    if (services_.pinned != nullptr) {
      // Bounded by 3 x 4 x io_tile_bytes; each rank's region and host states
      // are reserved by BuildRankLocked.
      STRATA_ASSIGN_OR_RETURN(
          pinned_reservation_,
          services_.pinned->Reserve(3 * streams * tile_elements * 4,
                                    absl::StrCat("job '", settings_.name, "' NVMe staging")));
    }
    STRATA_ASSIGN_OR_RETURN(states_, NvmeShardStateStore::Create(id_, state_layout, services_.nvme,
                                                                  tile_bytes));
  } else {
    states_ = std::make_unique<HostShardStateStore>(state_layout);
  }
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
  if (settings_.mode == strata::v1::MODE_INFINITY) {
    uint64_t largest_param_slot = 0, largest_grad_slot = 0, total_bytes = 0, built = 0;
    for (const RankState& rank : ranks_) {
      if (!rank.built) continue;
      ++built;
      for (const ExchangeSlot& slot : rank.slots) {
        largest_param_slot = std::max(largest_param_slot, ParamSlotBytes(slot));
        largest_grad_slot = std::max(largest_grad_slot, GradSlotBytes(slot));
        total_bytes += ParamSlotBytes(slot) + GradSlotBytes(slot);
      }
    }
    // The window budget covers params and gradients in their slots.
    uint64_t budget = settings_.pinned_budget_bytes;
    // Everything may stay up (ranks not yet registered are assumed alike).
    if (budget == 0 && built > 0) budget = total_bytes / built * settings_.world_size;
    // Room to work: a step writes one param slot beside a gradient.
    budget = std::max(budget, 2 * largest_param_slot + largest_grad_slot);
    param_budget_ = budget;
    STRATA_ASSIGN_OR_RETURN(grad_spill_, GradSpill::Create(id_, services_.nvme, largest_grad_slot));
    if (services_.pinned != nullptr) {
      // The window's budget and the staging that spilled gradients come back through.
      STRATA_ASSIGN_OR_RETURN(
          window_reservation_,
          services_.pinned->Reserve(budget + grad_spill_->staging_bytes(),
                                    absl::StrCat("job '", settings_.name, "' window (pinned_budget_bytes)")));
    }
    ParamCache::Locate locate = [this](uint32_t r, uint32_t index) {
      absl::MutexLock lock(&region_mu_);
      const PublishedRank& rank = published_[r];
      const ExchangeSlot& slot = rank.slots[index];
      return ParamCache::ShardRef{rank.base + slot.param_offset, ParamSlotBytes(slot), slot.param_offset};
    };
    ParamCache::Discard discard = [this](uint32_t r, uint32_t index) { DiscardParamSlot(r, index); };
    param_cache_ = services_.params != nullptr
                       ? std::make_unique<ParamCache>(id_, settings_.world_size, services_.params, std::move(locate),
                                                      budget, /*lookahead=*/4, std::move(discard))
                       : std::make_unique<ParamCache>(id_, settings_.world_size, services_.nvme, std::move(locate),
                                                      budget, /*lookahead=*/4, workers_, std::move(discard));
  }
  return absl::OkStatus();
}


absl::Status Job::BuildRankLocked(uint32_t r, std::vector<ShardLayout> shards, bool adopt) {
  RankState& rank = ranks_[r];
  const RequestLimits& limits = Limits();
  const uint64_t grad_bytes = DTypeSize(settings_.grad_dtype);
  const uint64_t param_bytes = DTypeSize(settings_.param_dtype);
  const StateLayout state_layout = StateLayoutFor(settings_.optimizer);
  const uint64_t streams = 1 + state_layout.exp_avg + state_layout.exp_avg_sq + state_layout.max_exp_avg_sq;
  // Sizes may come from a trainer: every product and sum is checked, and the
  // whole footprint is known (and refused, when too big) before anything is
  // allocated.
  uint64_t offset = 0;
  uint64_t state_bytes = 0;
  std::vector<ExchangeSlot> slots;
  for (ShardLayout& shard : shards) {
    ExchangeSlot slot;
    slot.grad_offset = offset;
    STRATA_ASSIGN_OR_RETURN(const uint64_t graw, CheckedMul(shard.padded_numel, grad_bytes, "grad slot bytes"));
    STRATA_ASSIGN_OR_RETURN(const uint64_t gslot, CheckedRoundUp(graw, kPage, "grad slot bytes"));
    STRATA_ASSIGN_OR_RETURN(offset, CheckedAdd(offset, gslot, "exchange region bytes"));
    slot.param_offset = offset;
    STRATA_ASSIGN_OR_RETURN(const uint64_t praw, CheckedMul(shard.padded_numel, param_bytes, "param slot bytes"));
    STRATA_ASSIGN_OR_RETURN(const uint64_t pslot, CheckedRoundUp(praw, kPage, "param slot bytes"));
    STRATA_ASSIGN_OR_RETURN(offset, CheckedAdd(offset, pslot, "exchange region bytes"));
    if (param_cache_ != nullptr && pslot > param_budget_ / 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", r, " shard ", shard.index, " needs ", pslot,
          " bytes of param slot, more than half the job's pinned budget of ", param_budget_,
          " bytes (raise pinned_budget_bytes or cut the shard)"));
    }
    if (settings_.mode != strata::v1::MODE_INFINITY) {
      // HostShardStateStore keeps each shard's states in pinned memory.
      STRATA_ASSIGN_OR_RETURN(const uint64_t sraw, CheckedMul(shard.padded_numel, streams * 4, "state bytes"));
      STRATA_ASSIGN_OR_RETURN(const uint64_t spage, CheckedRoundUp(std::max(sraw, kPage), kPage, "state bytes"));
      STRATA_ASSIGN_OR_RETURN(state_bytes, CheckedAdd(state_bytes, spage, "state bytes"));
    }
    slot.layout = std::move(shard);
    slots.push_back(std::move(slot));
  }
  const uint64_t region_bytes = std::max<uint64_t>(offset, kPage);
  if (region_bytes > limits.max_region_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("rank ", r, "'s exchange region would be ", region_bytes,
                                                     " bytes; max_region_bytes is ", limits.max_region_bytes));
  }
  const bool window = settings_.mode == strata::v1::MODE_INFINITY;
  // An Infinity region is a window: memory only for the slots in use, within
  // the job's budget, which BuildLayoutsLocked reserves once for the job.
  if (services_.pinned != nullptr && !window) {
    STRATA_ASSIGN_OR_RETURN(const uint64_t pinned_bytes, CheckedAdd(region_bytes, state_bytes, "pinned bytes"));
    STRATA_ASSIGN_OR_RETURN(rank.pinned, services_.pinned->Reserve(pinned_bytes, absl::StrCat("job '", settings_.name,
                                                                                             "' rank ", r)));
  }
  PinnedArenaOptions options;
  options.name = absl::StrCat("strata-job", id_, "-rank", r);
  options.size_bytes = region_bytes;
  options.populate = !window;
  STRATA_ASSIGN_OR_RETURN(rank.exchange, PinnedArena::Create(options));
  rank.slots = std::move(slots);
  rank.grad_ready.assign(rank.slots.size(), false);
  rank.applied.assign(rank.slots.size(), false);
  rank.grad_at.assign(rank.slots.size(), RankState::kNowhere);
  rank.grad_signals.assign(rank.slots.size(), 0);
  for (const ExchangeSlot& slot : rank.slots) {
    STRATA_RETURN_IF_ERROR(adopt ? states_->Adopt(r, slot.layout.index, slot.layout.padded_numel)
                                 : states_->Create(r, slot.layout.index, slot.layout.padded_numel));
  }
  ComputeGroupRunsLocked(rank);
  rank.built = true;
  {
    absl::MutexLock lock(&region_mu_);
    if (published_.size() < ranks_.size()) published_.resize(ranks_.size());
    published_[r] = PublishedRank{rank.exchange.data(), rank.slots, &rank.exchange};
  }
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

void Job::ComputeGroupRunsLocked(RankState& rank) {
  {
    for (ExchangeSlot& slot : rank.slots) {
      std::vector<GroupRun>& runs = slot.group_runs;
      runs.clear();
      // Ranges are sorted by shard_offset; a gap (padding) joins the run before it.
      for (const OwnedRange& r : slot.layout.ranges) {
        const uint32_t group = group_of_.at(r.tensor.value());
        if (!runs.empty() && runs.back().group == group) {
          runs.back().end = r.shard_offset + r.numel;
        } else if (runs.empty()) {
          runs.push_back(GroupRun{0, r.shard_offset + r.numel, group});
        } else {
          runs.back().end = r.shard_offset;
          runs.push_back(GroupRun{r.shard_offset, r.shard_offset + r.numel, group});
        }
      }
      if (runs.empty()) runs.push_back(GroupRun{0, 0, 0});
      runs.back().end = slot.layout.padded_numel;
    }
  }
}

std::vector<OptimizerHyperparams> Job::HyperparamsLocked() const {
  std::vector<OptimizerHyperparams> out(num_groups_, settings_.optimizer);
  for (size_t g = 0; g < group_hp_.size() && g < out.size(); ++g) {
    const strata::v1::GroupHyperparams& in = group_hp_[g];
    out[g].lr = in.lr();
    out[g].beta1 = in.beta1();
    out[g].beta2 = in.beta2();
    out[g].eps = in.eps();
    out[g].weight_decay = in.weight_decay();
    out[g].lr_decay = in.lr_decay();
  }
  return out;
}

absl::Status Job::BeginStep(uint64_t step, const std::vector<strata::v1::GroupHyperparams>& groups) {
  absl::MutexLock lock(&mu_);
  if (!registered_) return absl::FailedPreconditionError("BeginStep before RegisterTensors");
  // The step just applied, begun again (a re-attached rank repeating it):
  // the same values are a duplicate, checked below like another rank's copy.
  if (step < next_step_ && !(step + 1 == next_step_ && group_hp_step_ == step)) {
    return absl::FailedPreconditionError(
        absl::StrCat("BeginStep for step ", step, ", which was already applied; the job is at step ", next_step_));
  }
  if (group_hp_step_ == step) {
    // Another rank's copy: it must say the same.
    if (groups.size() != group_hp_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("BeginStep for step ", step, " sends ", groups.size(),
                                                     " groups but the step was begun with ", group_hp_.size()));
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      const strata::v1::GroupHyperparams& a = groups[g];
      const strata::v1::GroupHyperparams& b = group_hp_[g];
      const std::pair<const char*, std::pair<double, double>> fields[] = {
          {"lr", {a.lr(), b.lr()}},
          {"beta1", {a.beta1(), b.beta1()}},
          {"beta2", {a.beta2(), b.beta2()}},
          {"eps", {a.eps(), b.eps()}},
          {"weight_decay", {a.weight_decay(), b.weight_decay()}},
          {"lr_decay", {a.lr_decay(), b.lr_decay()}}};
      for (const auto& [field, values] : fields) {
        if (values.first != values.second) {
          return absl::InvalidArgumentError(absl::StrCat(
              "BeginStep for step ", step, " sets group ", g, " ", field, " = ", values.first,
              " but the step was begun with ", values.second, " (every rank must send the same values)"));
        }
      }
    }
    return absl::OkStatus();
  }
  if (step > next_step_) {
    return absl::FailedPreconditionError(absl::StrCat("BeginStep for step ", step,
                                                      " is too early; the job is at step ", next_step_));
  }
  if (step_has_grads_ || step_queued_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "BeginStep for step ", step, " came after the step's first GradReady; send it before any gradient"));
  }
  if (groups.size() < num_groups_) {
    return absl::InvalidArgumentError(absl::StrCat("BeginStep gives ", groups.size(),
                                                   " groups but the registered tensors use group indices up to ",
                                                   num_groups_ - 1, " (", num_groups_, " groups needed)"));
  }
  if (groups.size() > kMaxGroups) {
    return absl::InvalidArgumentError(absl::StrCat("BeginStep gives ", groups.size(), " groups; at most ",
                                                   kMaxGroups, " are allowed"));
  }
  std::vector<strata::v1::GroupHyperparams> previous = std::move(group_hp_);
  group_hp_ = groups;
  const std::vector<OptimizerHyperparams> hp = HyperparamsLocked();
  for (size_t g = 0; g < hp.size(); ++g) {
    if (absl::Status v = ValidateOptimizerHyperparams(hp[g]); !v.ok()) {
      group_hp_ = std::move(previous);
      return absl::InvalidArgumentError(absl::StrCat("BeginStep group ", g, ": ", v.message()));
    }
  }
  group_hp_step_ = step;
  return absl::OkStatus();
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
  if (registered_ && rank < ranks_.size() && ranks_[rank].built && param_cache_ != nullptr) {
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
      ranks_.clear();
      {
        absl::MutexLock regions(&region_mu_);
        published_.clear();
      }
      param_cache_.reset();
      grad_spill_.reset();
      states_.reset();
      window_reservation_ = PinnedBudget::Reservation();
      pinned_reservation_ = PinnedBudget::Reservation();
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

std::byte* Job::GradSlot(uint32_t rank, const ExchangeSlot& slot) const {
  absl::MutexLock lock(&region_mu_);
  return published_[rank].base + slot.grad_offset;
}

std::byte* Job::ParamSlot(uint32_t rank, const ExchangeSlot& slot) const {
  absl::MutexLock lock(&region_mu_);
  return published_[rank].base + slot.param_offset;
}

uint64_t Job::ParamSlotBytes(const ExchangeSlot& slot) const {
  return RoundUp(slot.layout.padded_numel * DTypeSize(settings_.param_dtype), kPage);
}

uint64_t Job::GradSlotBytes(const ExchangeSlot& slot) const {
  return RoundUp(slot.layout.padded_numel * DTypeSize(settings_.grad_dtype), kPage);
}

void Job::DiscardParamSlot(uint32_t rank, uint32_t index) const {
  absl::MutexLock lock(&region_mu_);
  const PublishedRank& r = published_[rank];
  if (r.region == nullptr || index >= r.slots.size()) return;
  // A failed punch (it cannot fail on a memfd short of a kernel bug) only
  // leaves memory in use; the slot's contents are not needed either way.
  (void)r.region->Discard(r.slots[index].param_offset, ParamSlotBytes(r.slots[index]));
}

void Job::DiscardGradSlot(uint32_t rank, const ExchangeSlot& slot) const {
  absl::MutexLock lock(&region_mu_);
  const PublishedRank& r = published_[rank];
  if (r.region == nullptr) return;
  (void)r.region->Discard(slot.grad_offset, GradSlotBytes(slot));
}

absl::Status Job::InitParams(uint32_t rank) {
  std::vector<ExchangeSlot> slots;
  {
    absl::MutexLock lock(&mu_);
    if (!registered_) return absl::FailedPreconditionError("InitParams before RegisterTensors");
    if (!worker_error_.ok()) return worker_error_;
    if (next_step_ > 0 || optimizer_steps_ > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job '", settings_.name, "' has already taken steps; a re-attached rank keeps its state "
          "and must not initialize params again"));
    }
    slots = ranks_[rank].slots;
  }
  std::vector<ShardId> ids;
  for (const ExchangeSlot& slot : slots) ids.push_back(ShardId{rank, slot.layout.index});
  CpuOptimizer* opt = services_.optimizer;
  const OptimizerHyperparams& hp = settings_.optimizer;
  absl::MutexLock states_lock(&states_mu_);
  STRATA_RETURN_IF_ERROR(states_->Update(ids, [&](const ShardId& id, const StateTile& tile) -> absl::Status {
    const ExchangeSlot& slot = slots[id.index];
    const std::byte* src = ParamSlot(rank, slot) + tile.offset * DTypeSize(settings_.param_dtype);
    STRATA_RETURN_IF_ERROR(opt->ConvertToFp32(src, settings_.param_dtype, tile.master, tile.size));
    StepSpans spans;
    spans.size = tile.size;
    spans.params = tile.master;
    spans.exp_avg = tile.exp_avg;
    spans.exp_avg_sq = tile.exp_avg_sq;
    spans.max_exp_avg_sq = tile.max_exp_avg_sq;
    spans.grad = GradSlot(rank, slot);
    spans.grad_dtype = settings_.grad_dtype;
    STRATA_RETURN_IF_ERROR(opt->InitializeState(hp, spans));
    // Infinity: the shard's params go home as soon as they are read, and
    // the window keeps only what its budget allows (the trainer wrote every
    // slot; they are freed shard by shard).
    if (param_cache_ != nullptr && tile.offset + tile.size == slot.layout.padded_numel) {
      STRATA_RETURN_IF_ERROR(param_cache_->StoreHome(rank, slot.layout.index));
    }
    return absl::OkStatus();
  }));
  std::string record;
  {
    absl::MutexLock lock(&mu_);
    ranks_[rank].initialized = true;
    bool all = true;
    for (const RankState& r : ranks_) all = all && r.initialized;
    if (all) PublishDoorbellsLocked();  // gradients are accepted from now on
    if (!all || services_.nvme == nullptr || settings_.mode != strata::v1::MODE_INFINITY) return absl::OkStatus();
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
  // A re-sent signal of a step that has every gradient -- the step just
  // applied, or the one whose optimizer step is running -- is a duplicate:
  // the shard was counted, so it changes nothing and WaitStep reports the
  // step's outcome. Ranks that re-attach after a crash re-send the step they
  // were in, and a doorbell entry can be drained after the other ranks'
  // signals completed the step; neither is an error.
  if (step + 1 == next_step_ || (step == next_step_ && step_queued_ && r.grad_ready[index])) {
    return absl::OkStatus();
  }
  if (step < next_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " was already applied; the job is at step ", next_step_));
  }
  if (step > next_step_ || step_queued_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step, " is not open for gradients; the job is at step ", next_step_,
        step_queued_ ? " and its optimizer step is running" : ""));
  }
  if (r.applied[index]) {
    // Already stepped with the first copy (early path); a restarted rank
    // re-sending the same gradient changes nothing.
    return absl::OkStatus();
  }
  r.grad_ready[index] = true;
  if (param_cache_ != nullptr && r.grad_at[index] != RankState::kInSlot) {
    // In its slot now (a re-sent gradient replaces a spilled copy).
    r.grad_at[index] = RankState::kInSlot;
    grad_resident_bytes_ += GradSlotBytes(r.slots[index]);
  }
  step_has_grads_ = true;
  grads_missing_ = 0;
  for (const RankState& rs : ranks_) {
    for (bool ready : rs.grad_ready) grads_missing_ += ready ? 0 : 1;
  }
  // Sending a gradient again replaces it: inspect the new contents.
  if (r.grad_signals.size() == r.slots.size()) ++r.grad_signals[index];
  if (inspect_queued_.insert({rank, index}).second) {
    queue_.push_back(WorkItem{WorkItem::kInspect, rank, index});
    ++r.grad_work;
  }
  if (grads_missing_ == 0) {
    if (settings_.external_step_agreement) {
      // The step waits for CommitStep; PrepareStep gets this daemon's share.
      queue_.push_back(WorkItem{WorkItem::kPrepare, 0, 0});
    } else {
      step_queued_ = true;
      queue_.push_back(WorkItem{WorkItem::kRunStep, 0, 0});
    }
  }
  ScheduleLocked();
  changed_.SignalAll();
  return absl::OkStatus();
}

namespace {

// Pairwise, so that daemons holding contiguous halves of the ranks, whose
// shares the trainers add, get the same bits as one daemon holding all.
double PairwiseSum(const double* v, size_t n) {
  if (n == 0) return 0;
  if (n == 1) return v[0];
  const size_t half = (n + 1) / 2;
  return PairwiseSum(v, half) + PairwiseSum(v + half, n - half);
}

}  // namespace

StepStats Job::LocalStatsLocked() const {
  StepStats stats;
  std::vector<double> per_rank;
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r].slots.empty()) continue;
    double sum = 0;
    for (uint32_t i = 0; i < ranks_[r].slots.size(); ++i) {
      auto it = inspections_.find({r, i});
      if (it == inspections_.end()) continue;
      stats.overflow = stats.overflow || it->second.first;
      sum += it->second.second;
    }
    per_rank.push_back(sum);
  }
  stats.squared_norm = PairwiseSum(per_rank.data(), per_rank.size());
  return stats;
}

absl::StatusOr<StepStats> Job::PrepareStep(uint64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (!settings_.external_step_agreement) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PrepareStep: job '", settings_.name, "' was not created with external_step_agreement"));
  }
  if (step > next_step_) {
    return absl::FailedPreconditionError(
        absl::StrCat("PrepareStep for step ", step, " is too early; the job is at step ", next_step_));
  }
  while (true) {
    auto it = prepared_.find(step);
    if (it != prepared_.end()) return it->second;
    if (!worker_error_.ok()) return worker_error_;
    if (step < next_step_) {
      return absl::NotFoundError(absl::StrCat("the local stats of step ", step, " are no longer kept"));
    }
    if (stopping_) return absl::UnavailableError("the daemon is stopping");
    if (changed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("PrepareStep ", step, " of job '", settings_.name,
                                                      "': ", grads_missing_, " local gradients are still missing"));
    }
  }
}

absl::Status Job::CommitStep(uint64_t step, const StepStats& global) {
  absl::MutexLock lock(&mu_);
  if (!settings_.external_step_agreement) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CommitStep: job '", settings_.name, "' was not created with external_step_agreement"));
  }
  if (auto it = committed_.find(step); it != committed_.end()) {
    if (it->second == global) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "CommitStep for step ", step, " says overflow=", global.overflow, " squared_norm=", global.squared_norm,
        " but the step was committed with overflow=", it->second.overflow,
        " squared_norm=", it->second.squared_norm, " (every rank must commit the all-reduced values)"));
  }
  if (step != next_step_) {
    return absl::FailedPreconditionError(absl::StrCat("CommitStep for step ", step, "; the job is at step ",
                                                      next_step_));
  }
  auto it = prepared_.find(step);
  if (it == prepared_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CommitStep for step ", step, " before every local rank's gradients are in (call PrepareStep first)"));
  }
  const StepStats& local = it->second;
  if (std::isnan(global.squared_norm) ? !global.overflow : global.squared_norm < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CommitStep: squared_norm ", global.squared_norm,
                                                   " is not a sum of squares"));
  }
  if (local.overflow && !global.overflow) {
    return absl::InvalidArgumentError(
        "CommitStep: this daemon's gradients overflowed but the committed overflow flag is false "
        "(all-reduce the flags with MAX/OR)");
  }
  if (!global.overflow && global.squared_norm < local.squared_norm) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CommitStep: the global squared_norm ", global.squared_norm, " is below this daemon's own ",
        local.squared_norm, " (all-reduce PrepareStep's squared_norm with SUM)"));
  }
  committed_[step] = global;
  committed_.erase(step >= 64 ? step - 64 : UINT64_MAX);
  step_queued_ = true;
  queue_.push_back(WorkItem{WorkItem::kRunStep, 0, 0});
  ScheduleLocked();
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> Job::WaitStep(uint64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = outcomes_.find(step);
    if (it != outcomes_.end()) return it->second;
    if (!worker_error_.ok()) return worker_error_;
    if (step < next_step_) {
      return absl::NotFoundError(absl::StrCat("the outcome of step ", step, " is no longer kept"));
    }
    if (stopping_) return absl::UnavailableError("the daemon is stopping");
    if (changed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "step ", step, " of job '", settings_.name, "' did not finish in time; ", grads_missing_,
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
  if (item.kind == WorkItem::kInspect) Inspect(item.rank, item.index);
  if (item.kind == WorkItem::kRunStep) RunStep();
  if (item.kind == WorkItem::kPrepare) {
    absl::MutexLock lock(&mu_);
    if (grads_missing_ == 0 && !step_queued_) {
      prepared_[next_step_] = LocalStatsLocked();
      prepared_.erase(next_step_ >= 64 ? next_step_ - 64 : UINT64_MAX);
      changed_.SignalAll();
    }
  }
  absl::MutexLock lock(&mu_);
  if (item.kind == WorkItem::kInspect && item.rank < ranks_.size() && ranks_[item.rank].grad_work > 0) {
    --ranks_[item.rank].grad_work;
  }
  turn_scheduled_ = false;
  ScheduleLocked();      // the next item waits behind other jobs' turns
  changed_.SignalAll();  // Stop waits for the last turn
}

void Job::Inspect(uint32_t rank, uint32_t index) {
  ExchangeSlot slot;
  {
    absl::MutexLock lock(&mu_);
    inspect_queued_.erase({rank, index});
    slot = ranks_[rank].slots[index];
  }
  GradView grad{GradSlot(rank, slot), settings_.grad_dtype, slot.layout.padded_numel};
  auto overflow = services_.optimizer->HasInfOrNan(grad);
  auto norm = services_.optimizer->SquaredL2Norm(grad);
  absl::MutexLock lock(&mu_);
  if (!overflow.ok() || !norm.ok()) {
    worker_error_ = !overflow.ok() ? overflow.status() : norm.status();
    changed_.SignalAll();
    PublishDoorbellsLocked();
    return;
  }
  inspections_[{rank, index}] = {*overflow, *norm};
  if (param_cache_ != nullptr) {
    FitWindowLocked(rank, index);
    return;
  }
  if (!early_apply_ || ranks_[rank].applied[index]) return;
  // Nothing global decides this shard's update (no loss scaling, no
  // clipping): step it now, while the trainers are still in backward.
  const int64_t optimizer_step = static_cast<int64_t>(optimizer_steps_) + 1;
  std::vector<std::vector<ExchangeSlot>> slots;
  for (const RankState& r : ranks_) slots.push_back(r.slots);
  const std::vector<OptimizerHyperparams> hp = HyperparamsLocked();
  ranks_[rank].applied[index] = true;
  mu_.Unlock();
  absl::Status status;
  {
    absl::MutexLock states_lock(&states_mu_);
    status = ApplyShards({ShardId{rank, index}}, slots, optimizer_step, 1.0f, hp);
  }
  mu_.Lock();
  if (!status.ok()) {
    worker_error_ = absl::Status(status.code(), absl::StrCat("optimizer step of job '", settings_.name,
                                                             "' failed: ", status.message()));
    changed_.SignalAll();
    PublishDoorbellsLocked();
  }
}

void Job::FitWindowLocked(uint32_t rank, uint32_t index) {
  RankState& r = ranks_[rank];
  if (r.grad_at[index] != RankState::kInSlot) return;
  // Clean params go first: they are copies of their NVMe homes.
  const uint64_t params = param_cache_->SetReserved(grad_resident_bytes_);
  if (params + grad_resident_bytes_ <= param_budget_) return;
  // Still over (pinned params, or gradients alone fill the budget): this
  // gradient, inspected already, goes to NVMe until the step needs it.
  const ExchangeSlot slot = r.slots[index];
  const uint64_t bytes = GradSlotBytes(slot);
  const uint64_t signals = index < r.grad_signals.size() ? r.grad_signals[index] : 0;
  mu_.Unlock();
  absl::Status spilled = grad_spill_->Spill(rank, index, absl::Span<const std::byte>(GradSlot(rank, slot), bytes));
  if (!spilled.ok()) {
    // A device fault (EIO, ENOSPC, a torn write) is reported as a failed
    // step would be, not hidden: nothing of the step is kept (the spills so
    // far are dropped) and the job is reloaded from its last commit when its
    // ranks attach again and resend the step's gradients.
    absl::MutexLock commit_lock(&commit_mu_);
    if (!superseded_) services_.nvme->Rollback(id_);
  }
  mu_.Lock();
  if (!spilled.ok()) {
    worker_error_ = absl::Status(
        spilled.code(),
        absl::StrCat(spilled.message(), "; nothing of step ", next_step_, " of job '", settings_.name,
                     "' was committed (the job's NVMe state is its last commit). Attach its ranks again (Attach, "
                     "RegisterTensors, no InitParams) and resend step ", next_step_, "'s gradients"));
    reload_needed_ = true;
    changed_.SignalAll();
    PublishDoorbellsLocked();
    return;
  }
  if (r.grad_at[index] != RankState::kInSlot) return;
  // The trainer sent this gradient again while it was being written out: the
  // slot holds the new one (its inspection is queued) and the copy on NVMe is
  // stale, so the slot is kept. Checked and discarded under mu_, so a
  // GradReady cannot slip in between.
  if (index < r.grad_signals.size() && r.grad_signals[index] != signals) return;
  DiscardGradSlot(rank, slot);
  r.grad_at[index] = RankState::kSpilled;
  grad_resident_bytes_ -= bytes;
  counters_.grad_bytes_spilled += bytes;
  param_cache_->SetReserved(grad_resident_bytes_);
}

void Job::ClearGradsAfterStep() {
  std::vector<std::pair<uint32_t, ExchangeSlot>> in_slot;
  {
    absl::MutexLock lock(&mu_);
    for (uint32_t rank = 0; rank < ranks_.size(); ++rank) {
      RankState& r = ranks_[rank];
      for (size_t i = 0; i < r.grad_at.size(); ++i) {
        if (r.grad_at[i] == RankState::kInSlot) in_slot.emplace_back(rank, r.slots[i]);
        r.grad_at[i] = RankState::kNowhere;
      }
    }
    grad_resident_bytes_ = 0;
    counters_.grad_bytes_read_back = grad_spill_->read_back_bytes();
  }
  // The step consumed them; the next step's gradients are written anew.
  for (const auto& [rank, slot] : in_slot) DiscardGradSlot(rank, slot);
  param_cache_->SetReserved(0);
  grad_spill_->EndReadback();
  grad_spill_->DeleteAll();
}

absl::Status Job::ApplyShards(const std::vector<ShardId>& ids,
                              const std::vector<std::vector<ExchangeSlot>>& slots, int64_t optimizer_step,
                              float grad_scale, const std::vector<OptimizerHyperparams>& hp,
                              const std::function<absl::Status(const ShardId&)>& shard_done,
                              const std::function<absl::StatusOr<const std::byte*>(const ShardId&)>& grad_source) {
  const std::byte* shard_grad = nullptr;  // grad_source's answer for the shard being stepped
  const bool sixteen_bit = settings_.param_dtype != DType::kFp32;
  const size_t psize = DTypeSize(settings_.param_dtype);
  const size_t gsize = DTypeSize(settings_.grad_dtype);
  return states_->Update(ids, [&](const ShardId& id, const StateTile& tile) -> absl::Status {
    const ExchangeSlot& slot = slots[id.rank][id.index];
    const uint64_t tile_end = tile.offset + tile.size;
    if (!grad_source) {
      shard_grad = GradSlot(id.rank, slot);
    } else if (tile.offset == 0) {
      STRATA_ASSIGN_OR_RETURN(shard_grad, grad_source(id));
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
      std::byte* param_out = ParamSlot(id.rank, slot) + lo * psize;
      if (sixteen_bit) {
        spans.param_out = param_out;
        spans.param_out_dtype = settings_.param_dtype;
      }
      STRATA_RETURN_IF_ERROR(services_.optimizer->Step(hp.at(run.group), optimizer_step, spans, grad_scale));
      if (!sixteen_bit) std::memcpy(param_out, spans.params, spans.size * sizeof(float));
    }
    if (shard_done && tile_end == slot.layout.padded_numel) return shard_done(id);
    return absl::OkStatus();
  });
}

void Job::RunStep() {
  const absl::Time start = absl::Now();
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
    // A failed gradient spill (FitWindowLocked) failed this step already:
    // nothing of it may be applied or committed; the job is reloaded.
    if (reload_needed_) return;
    StepStats stats = LocalStatsLocked();
    if (settings_.external_step_agreement) stats = committed_.at(next_step_);
    overflow = stats.overflow;
    squared = stats.squared_norm;
    scale = scaler_.scale();
    scaler_enabled = scaler_.enabled();
    step = next_step_;
    optimizer_step = static_cast<int64_t>(optimizer_steps_) + 1;
    for (const RankState& r : ranks_) slots.push_back(r.slots);
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
      for (uint32_t r = 0; r < slots.size(); ++r) {
        for (const ExchangeSlot& s : slots[r]) {
          // Shards the early path already stepped (see Inspect) are done.
          if (!ranks_[r].applied[s.layout.index]) ids.push_back(ShardId{r, s.layout.index});
        }
      }
    }
    absl::MutexLock states_lock(&states_mu_);
    if (param_cache_ != nullptr) param_cache_->BeginUpdate();
    std::function<absl::Status(const ShardId&)> shard_done;
    std::function<absl::StatusOr<const std::byte*>(const ShardId&)> grad_source;
    std::vector<std::vector<RankState::GradAt>> grad_at;
    if (param_cache_ != nullptr) {
      {
        absl::MutexLock lock(&mu_);
        for (const RankState& r : ranks_) grad_at.push_back(r.grad_at);
      }
      // Spilled gradients come back in step order, the next one read while
      // the step works on this one.
      std::vector<std::pair<ShardId, uint64_t>> spilled;
      for (const ShardId& id : ids) {
        if (grad_at[id.rank][id.index] == RankState::kSpilled) {
          spilled.emplace_back(id, GradSlotBytes(slots[id.rank][id.index]));
        }
      }
      grad_spill_->BeginReadback(std::move(spilled));
      grad_source = [&](const ShardId& id) -> absl::StatusOr<const std::byte*> {
        if (grad_at[id.rank][id.index] == RankState::kSpilled) return grad_spill_->Next(id);
        return GradSlot(id.rank, slots[id.rank][id.index]);
      };
      // The window: as each shard is stepped its gradient slot is freed and
      // its new params go home; the cache keeps the param slot only within
      // the budget, so the step never has every slot in memory at once.
      shard_done = [&](const ShardId& id) {
        if (grad_at[id.rank][id.index] == RankState::kInSlot) {
          const ExchangeSlot& slot = slots[id.rank][id.index];
          DiscardGradSlot(id.rank, slot);
          uint64_t reserved;
          {
            absl::MutexLock lock(&mu_);
            ranks_[id.rank].grad_at[id.index] = RankState::kNowhere;
            grad_resident_bytes_ -= GradSlotBytes(slot);
            reserved = grad_resident_bytes_;
          }
          param_cache_->SetReserved(reserved);
        }
        return param_cache_->StoreHome(id.rank, id.index);
      };
    }
    status = ApplyShards(ids, slots, optimizer_step, grad_scale, hp, shard_done, grad_source);
    if (param_cache_ != nullptr) {
      param_cache_->EndUpdate();
      // Before the commit: no spilled copy may become durable.
      ClearGradsAfterStep();
    }
    if (status.ok() && services_.nvme != nullptr && settings_.mode == strata::v1::MODE_INFINITY) {
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
      status = CommitWithRecord(record);
    }
  } else if (param_cache_ != nullptr) {
    ClearGradsAfterStep();  // a skipped step's gradients are not needed either
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!status.ok() && services_.nvme != nullptr && settings_.mode == strata::v1::MODE_INFINITY) {
    // Nothing of the failed step may become durable (not even by the commit
    // of every owner at shutdown): back to the last committed step.
    absl::MutexLock commit_lock(&commit_mu_);
    if (!superseded_) services_.nvme->Rollback(id_);
  }
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    const bool nvme = services_.nvme != nullptr && settings_.mode == strata::v1::MODE_INFINITY;
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
  outcomes_[step] = outcome;
  outcomes_.erase(step >= 64 ? step - 64 : UINT64_MAX);  // keep a bounded history
  if (skip) ++counters_.steps_skipped;
  else ++counters_.steps_applied;
  counters_.last_step_s = seconds;
  counters_.total_step_s += seconds;
  inspections_.clear();
  grads_missing_ = 0;
  for (RankState& r : ranks_) {
    std::fill(r.grad_ready.begin(), r.grad_ready.end(), false);
    std::fill(r.applied.begin(), r.applied.end(), false);
    grads_missing_ += r.grad_ready.size();
  }
  step_queued_ = false;
  step_has_grads_ = false;
  next_step_ = step + 1;
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
  record.next_step = next_step_;
  record.optimizer_steps = optimizer_steps_;
  record.loss_scaler = scaler_.state();
  record.groups = group_of_;
  record.group_hyperparams = group_hp_;
  if (supplied_) record.partitions = supplied_partitions_;
  record.owner_uid = settings_.owner_uid;
  return record;
}

void Job::ApplyRecordLocked(const JobRecord& record) {
  for (RankState& rank : ranks_) rank.initialized = true;
  next_step_ = record.next_step;
  optimizer_steps_ = record.optimizer_steps;
  scaler_ = LossScaler(settings_.loss_scale, record.loss_scaler);
  group_hp_ = record.group_hyperparams;
  group_hp_step_.reset();
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
  if (services_.nvme == nullptr || settings_.mode != strata::v1::MODE_INFINITY) return absl::OkStatus();
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
  if (param_cache_ == nullptr) {
    // Offload mode: params are always in the slots.
    return absl::OkStatus();
  }
  return param_cache_->Acquire(rank, indices, deadline);
}

absl::Status Job::Release(uint32_t rank, const std::vector<uint32_t>& indices) {
  if (param_cache_ == nullptr) return absl::OkStatus();
  return param_cache_->Release(rank, indices);
}

absl::Status Job::IterationBoundary(uint32_t rank) {
  if (param_cache_ != nullptr) param_cache_->IterationBoundary(rank);
  return absl::OkStatus();
}

void Job::DropPins(uint32_t rank) {
  if (param_cache_ != nullptr) param_cache_->ReleaseAll(rank);
}

}  // namespace strata
