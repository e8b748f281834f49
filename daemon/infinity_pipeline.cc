#include "daemon/infinity_pipeline.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/status_macros.h"
#include "daemon/job.h"
#include "daemon/nvme_shard_state_store.h"
#include "swap/extent_store.h"

namespace strata {
namespace {

// The largest param and gradient slot of the ranks built so far, and the
// bytes of all their slots.
struct SlotSizes {
  uint64_t largest_param_slot = 0;
  uint64_t largest_grad_slot = 0;
  uint64_t total_bytes = 0;
};

absl::StatusOr<SlotSizes> MeasureSlots(const std::vector<const std::vector<ExchangeSlot>*>& built,
                                       const SlotDTypes& dtypes) {
  SlotSizes out;
  for (const std::vector<ExchangeSlot>* slots : built) {
    for (const ExchangeSlot& slot : *slots) {
      const uint64_t param = dtypes.ParamSlotBytes(slot), grad = dtypes.GradSlotBytes(slot);
      out.largest_param_slot = std::max(out.largest_param_slot, param);
      out.largest_grad_slot = std::max(out.largest_grad_slot, grad);
      STRATA_ASSIGN_OR_RETURN(const uint64_t both, CheckedAdd(param, grad, "a slot's param and gradient bytes"));
      STRATA_ASSIGN_OR_RETURN(out.total_bytes, CheckedAdd(out.total_bytes, both, "the slots' bytes"));
    }
  }
  return out;
}

// The window's budget for params and gradients in their slots: the job's
// pinned_budget_bytes, or (0) room for every slot of every rank (ranks not
// yet registered are assumed alike); at least room to work, as a step
// writes one param slot beside a gradient.
absl::StatusOr<uint64_t> WindowBudget(const SlotSizes& sizes, uint64_t pinned_budget_bytes, size_t ranks_built,
                                      uint32_t world_size) {
  uint64_t budget = pinned_budget_bytes;
  if (budget == 0 && ranks_built > 0) {
    STRATA_ASSIGN_OR_RETURN(budget, CheckedMul(sizes.total_bytes / ranks_built, world_size,
                                               "every rank's slots"));
  }
  STRATA_ASSIGN_OR_RETURN(const uint64_t two_params, CheckedMul(2, sizes.largest_param_slot, "two param slots"));
  STRATA_ASSIGN_OR_RETURN(const uint64_t floor,
                          CheckedAdd(two_params, sizes.largest_grad_slot, "two param slots and a gradient slot"));
  return std::max(budget, floor);
}

// What the window reserves of --pinned_capacity: its budget, the gradient
// spill's staging and `param_stagings` staging slots for new params.
absl::StatusOr<uint64_t> WindowReservationBytes(uint64_t budget, uint64_t spill_staging, uint64_t largest_param_slot,
                                                uint64_t param_stagings) {
  STRATA_ASSIGN_OR_RETURN(const uint64_t stagings,
                          CheckedMul(param_stagings, largest_param_slot, "the new params' staging"));
  STRATA_ASSIGN_OR_RETURN(const uint64_t with_spill, CheckedAdd(budget, spill_staging, "the budget and its spill staging"));
  return CheckedAdd(with_spill, stagings, "the budget and its staging");
}

// The window's sizes are sums with pinned_budget_bytes, the client's number:
// one that would wrap (and so reserve a few pages while the job may hold its
// whole "budget") is the request's error, named as such.
absl::Status BudgetOverflow(const std::string& job_name, uint64_t pinned_budget_bytes, const absl::Status& overflow) {
  return absl::InvalidArgumentError(absl::StrCat(
      "pinned_budget_bytes ", pinned_budget_bytes, " of job '", job_name, "': the window it sizes does not fit 64 bits (",
      overflow.message(), "); create the job with a smaller pinned_budget_bytes, within --pinned_capacity "
      "(or 0 to let the daemon size the window)"));
}

}  // namespace

InfinityPipeline::InfinityPipeline(uint64_t job_id, std::string job_name, uint32_t world_size, SlotDTypes dtypes,
                                   uint64_t pinned_budget_bytes, ExtentStore* nvme, PinnedBudget* pinned,
                                   ParamStore* params, bool early_apply)
    : job_id_(job_id),
      job_name_(std::move(job_name)),
      world_size_(world_size),
      dtypes_(dtypes),
      pinned_budget_bytes_(pinned_budget_bytes),
      early_apply_(early_apply),
      nvme_(nvme),
      pinned_(pinned),
      params_store_(params) {}

InfinityPipeline::~InfinityPipeline() = default;

absl::StatusOr<std::unique_ptr<ShardStateStore>> InfinityPipeline::MakeStates(const StateLayout& layout,
                                                                              uint64_t tile_bytes) {
  const uint64_t streams = 1 + layout.exp_avg + layout.exp_avg_sq + layout.max_exp_avg_sq;
  const uint64_t tile_elements = std::max<uint64_t>(tile_bytes / 4 / 1024 * 1024, 1024);
  if (pinned_ != nullptr) {
    // Bounded by 3 x 4 x io_tile_bytes; the window is reserved by OpenWindow.
    STRATA_ASSIGN_OR_RETURN(staging_reservation_,
                            pinned_->Reserve(3 * streams * tile_elements * 4,
                                             absl::StrCat("job '", job_name_, "' NVMe staging")));
  }
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<NvmeShardStateStore> states,
                          NvmeShardStateStore::Create(job_id_, layout, nvme_, tile_bytes));
  return std::unique_ptr<ShardStateStore>(std::move(states));
}

absl::StatusOr<uint64_t> InfinityPipeline::RankPinnedBytes(uint32_t rank, const ExchangeLayout& layout,
                                                           const StateLayout& /*states*/) const {
  for (const ExchangeSlot& slot : layout.slots) {
    const uint64_t pslot = dtypes_.ParamSlotBytes(slot);
    if (param_cache_ != nullptr && pslot > param_budget_ / 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", rank, " shard ", slot.layout.index, " needs ", pslot,
          " bytes of param slot, more than half the job's pinned budget of ", param_budget_,
          " bytes (raise pinned_budget_bytes or cut the shard)"));
    }
  }
  // The region is a window: memory only for the slots in use, within the
  // job's budget, which OpenWindow reserves once for the job.
  return 0;
}

absl::Status InfinityPipeline::OpenWindow(const std::vector<const std::vector<ExchangeSlot>*>& built,
                                          ExchangeRegions* regions, TransferExecutor* workers,
                                          std::function<void()> rollback) {
  regions_ = regions;
  rollback_ = std::move(rollback);
  auto refuse = [&](const absl::Status& overflow) { return BudgetOverflow(job_name_, pinned_budget_bytes_, overflow); };
  absl::StatusOr<SlotSizes> sizes = MeasureSlots(built, dtypes_);
  if (!sizes.ok()) return refuse(sizes.status());
  absl::StatusOr<uint64_t> window = WindowBudget(*sizes, pinned_budget_bytes_, built.size(), world_size_);
  if (!window.ok()) return refuse(window.status());
  const uint64_t budget = *window;
  const uint64_t largest_param_slot = sizes->largest_param_slot, largest_grad_slot = sizes->largest_grad_slot;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<GradSpill> spill, GradSpill::Create(job_id_, nvme_, largest_grad_slot));
  if (pinned_ != nullptr) {
    // The window's budget, the staging that spilled gradients come back
    // through and the one the step writes new params into (two, taking
    // turns, where shards are stepped early).
    absl::StatusOr<uint64_t> reserved =
        WindowReservationBytes(budget, spill->staging_bytes(), largest_param_slot, early_apply_ ? 2 : 1);
    if (!reserved.ok()) return refuse(reserved.status());
    STRATA_ASSIGN_OR_RETURN(window_reservation_,
                            pinned_->Reserve(*reserved, absl::StrCat("job '", job_name_, "' window (pinned_budget_bytes)")));
  }
  grad_spill_ = std::move(spill);
  param_budget_ = budget;
  // Each rank's share of it for gradients, so a trainer writing a step's
  // gradients faster than the daemon inspects and spills them waits instead
  // of growing the window past the budget; no limit when the job set none.
  // (Twice a slot cannot wrap: slots are mapped memory, their sum checked.)
  if (pinned_budget_bytes_ != 0) {
    const uint64_t rank_share = budget / std::max<uint32_t>(world_size_, 1);
    grad_room_ = std::max(rank_share, 2 * largest_grad_slot);
    grad_keep_ = grad_room_ - largest_grad_slot;
    // The same share of the window for InitParams' batches of params.
    init_batch_bytes_ = std::max(rank_share, largest_param_slot);
  }
  // Where steps (early ones too) write new params (counted above); touched
  // now, as a step's first write into fresh pages costs as much as the
  // window's faults this staging avoids.
  STRATA_ASSIGN_OR_RETURN(param_staging_, AlignedBuffer::Allocate(std::max<uint64_t>(largest_param_slot, 1),
                                                                  nvme_->alignment()));
  std::memset(param_staging_.data(), 0, param_staging_.size());
  if (early_apply_) {
    STRATA_ASSIGN_OR_RETURN(param_staging_alt_, AlignedBuffer::Allocate(param_staging_.size(), nvme_->alignment()));
    std::memset(param_staging_alt_.data(), 0, param_staging_alt_.size());
  }
  ParamCache::Locate locate = [regions](uint32_t r, uint32_t index) {
    const auto [slot, bytes] = regions->ParamShard(r, index);
    return ParamCache::ShardRef{slot, bytes};
  };
  ParamCache::Discard discard = [regions](uint32_t r, uint32_t index) { regions->DiscardParamSlot(r, index); };
  // The daemon's one param store; a store of the job's own where there is
  // none (a Job made by a test or a tool).
  param_cache_ = params_store_ != nullptr
                     ? std::make_unique<ParamCache>(job_id_, world_size_, params_store_, std::move(locate), budget,
                                                    /*lookahead=*/4, std::move(discard))
                     : std::make_unique<ParamCache>(job_id_, world_size_, nvme_, std::move(locate), budget,
                                                    /*lookahead=*/4, workers, std::move(discard));
  return absl::OkStatus();
}

void InfinityPipeline::AddRankLocked(absl::Mutex& /*job_mu*/, uint32_t rank, uint32_t world, size_t shards) {
  if (grad_at_.size() < world) grad_at_.resize(world);
  if (grad_signals_.size() < world) grad_signals_.resize(world);
  if (grad_held_.size() < world) grad_held_.resize(world, 0);
  grad_held_[rank] = 0;
  grad_at_[rank].assign(shards, kNowhere);
  grad_signals_[rank].assign(shards, 0);
}

void InfinityPipeline::DropRankLocked(absl::Mutex& /*job_mu*/, uint32_t rank) {
  if (rank < grad_at_.size()) grad_at_[rank].clear();
  if (rank < grad_signals_.size()) grad_signals_[rank].clear();
  if (rank < grad_held_.size()) {
    grad_resident_bytes_ -= grad_held_[rank];
    grad_held_[rank] = 0;
  }
}

void InfinityPipeline::CloseWindow() {
  param_cache_.reset();
  grad_spill_.reset();
}

void InfinityPipeline::ReleasePinned() {
  window_reservation_ = PinnedBudget::Reservation();
  staging_reservation_ = PinnedBudget::Reservation();
}

uint64_t InfinityPipeline::pinned_bytes() const { return staging_reservation_.bytes() + window_reservation_.bytes(); }

void InfinityPipeline::CountLocked(absl::Mutex& /*job_mu*/, JobCounters& counters) const {
  if (param_cache_ != nullptr) counters.window_budget_bytes = param_budget_;
  counters.grad_bytes_spilled = grad_bytes_spilled_;
  counters.grad_bytes_read_back = grad_bytes_read_back_;
}

ParamCacheStats InfinityPipeline::param_stats() const {
  return param_cache_ != nullptr ? param_cache_->stats() : ParamCacheStats{};
}

absl::Status InfinityPipeline::ParamsWritten(uint32_t rank, uint32_t index) {
  // The shard's params go home as soon as they are read, and the window
  // keeps only what its budget allows.
  if (param_cache_ == nullptr) return absl::OkStatus();
  return param_cache_->StoreHome(rank, index);
}

absl::Status InfinityPipeline::ParamsInitialized(uint32_t rank, uint32_t index) {
  STRATA_RETURN_IF_ERROR(ParamsWritten(rank, index));
  // With a budget the trainer writes the model in batches of a rank's share
  // of it (InitBatchBytes): the copies the window kept would leave no room
  // for the next batch, so none is kept (the first forward prefetches).
  if (param_cache_ != nullptr && init_batch_bytes_ != 0) param_cache_->Drop(rank, index);
  return absl::OkStatus();
}

absl::StatusOr<const std::byte*> InfinityPipeline::ParamsToSave(uint32_t rank, const ExchangeSlot& slot,
                                                                const std::byte* in_slot,
                                                                std::optional<AlignedBuffer>& scratch) const {
  // Their home on NVMe is the truth: a slot may be empty (a job restored
  // after a restart has not read its params back yet) or not resident.
  if (param_cache_ == nullptr) return in_slot;
  STRATA_ASSIGN_OR_RETURN(AlignedBuffer home, AlignedBuffer::Allocate(dtypes_.ParamSlotBytes(slot), nvme_->alignment()));
  scratch.emplace(std::move(home));
  STRATA_RETURN_IF_ERROR(param_cache_->ReadHome(rank, slot.layout.index, scratch->span()));
  return static_cast<const std::byte*>(scratch->data());
}

absl::Status InfinityPipeline::Acquire(uint32_t rank, const std::vector<uint32_t>& indices, absl::Time deadline) {
  if (param_cache_ == nullptr) return absl::OkStatus();
  return param_cache_->Acquire(rank, indices, deadline);
}

absl::Status InfinityPipeline::Release(uint32_t rank, const std::vector<uint32_t>& indices) {
  if (param_cache_ == nullptr) return absl::OkStatus();
  return param_cache_->Release(rank, indices);
}

void InfinityPipeline::IterationBoundary(uint32_t rank) {
  if (param_cache_ != nullptr) param_cache_->IterationBoundary(rank);
}

void InfinityPipeline::DropPins(uint32_t rank) {
  if (param_cache_ != nullptr) param_cache_->ReleaseAll(rank);
}

void InfinityPipeline::GradArrivedLocked(absl::Mutex& /*job_mu*/, uint32_t rank, uint32_t index,
                                         const ExchangeSlot& slot) {
  if (param_cache_ != nullptr && grad_at_[rank][index] != kInSlot) {
    // In its slot now (a re-sent gradient replaces a spilled copy).
    grad_at_[rank][index] = kInSlot;
    grad_resident_bytes_ += dtypes_.GradSlotBytes(slot);
    grad_held_[rank] += dtypes_.GradSlotBytes(slot);
    // Clean params make room at once: the trainer's room (GradWindowLocked)
    // counts gradients only, so the params must not wait for the inspection.
    param_cache_->SetReserved(grad_resident_bytes_);
  }
  // Sending a gradient again replaces it: a spill in progress must see that.
  if (index < grad_signals_[rank].size()) ++grad_signals_[rank][index];
}

absl::Status InfinityPipeline::AfterInspectLocked(absl::Mutex& job_mu, uint32_t rank, uint32_t index,
                                                  const ExchangeSlot& slot) {
  if (grad_at_[rank][index] != kInSlot) return absl::OkStatus();
  // Clean params go first: they are copies of their NVMe homes.
  const uint64_t params = param_cache_->SetReserved(grad_resident_bytes_);
  const bool rank_fits = grad_room_ == 0 || grad_held_[rank] <= grad_keep_;
  // A gradient an early step will take leaves its slot as soon as it is
  // stepped (EarlyStepLocked): spilling it would only write it out and read
  // it back. The rank's trainer waits for that room (WaitGradRoom) instead.
  if (params + grad_resident_bytes_ <= param_budget_ && (rank_fits || early_apply_)) return absl::OkStatus();
  // Still over (pinned params, gradients alone fill the budget, or the rank
  // holds more than its keep): this gradient, inspected already, goes to NVMe
  // until the step needs it.
  const uint64_t bytes = dtypes_.GradSlotBytes(slot);
  const uint64_t signals = index < grad_signals_[rank].size() ? grad_signals_[rank][index] : 0;
  job_mu.Unlock();
  absl::Status spilled =
      grad_spill_->Spill(rank, index, absl::Span<const std::byte>(regions_->GradSlot(rank, slot), bytes));
  if (!spilled.ok()) {
    // A device fault (EIO, ENOSPC, a torn write) is reported as a failed
    // step would be, not hidden: nothing of the step is kept (the spills so
    // far are dropped) and the job is reloaded from its last commit when its
    // ranks attach again and resend the step's gradients.
    rollback_();
  }
  job_mu.Lock();
  if (!spilled.ok()) return spilled;
  if (grad_at_[rank][index] != kInSlot) return absl::OkStatus();
  // The trainer sent this gradient again while it was being written out: the
  // slot holds the new one (its inspection is queued) and the copy on NVMe is
  // stale, so the slot is kept. Checked and discarded under the job's lock,
  // so a GradReady cannot slip in between.
  if (index < grad_signals_[rank].size() && grad_signals_[rank][index] != signals) return absl::OkStatus();
  regions_->DiscardGradSlot(rank, slot);
  grad_at_[rank][index] = kSpilled;
  grad_resident_bytes_ -= bytes;
  grad_held_[rank] -= bytes;
  grad_bytes_spilled_ += bytes;
  param_cache_->SetReserved(grad_resident_bytes_);
  return absl::OkStatus();
}

GradWindow InfinityPipeline::GradWindowLocked(absl::Mutex& /*job_mu*/, uint32_t rank) const {
  GradWindow w;
  w.room = grad_room_;
  w.keep = grad_keep_;
  w.held = rank < grad_held_.size() ? grad_held_[rank] : 0;
  return w;
}

ShardKey InfinityPipeline::SteppedKey(uint64_t job_id, uint32_t rank, uint32_t index) {
  return ShardKey{JobId(job_id), Rank(rank), TensorId(index), TensorKind::kParam16, 1};
}

std::optional<StepHooks> InfinityPipeline::EarlyStepLocked(absl::Mutex& job_mu, uint32_t rank,
                                                           uint32_t index, const ExchangeSlot& slot,
                                                           bool step_certain) {
  if (!early_apply_ || param_cache_ == nullptr || grad_at_[rank][index] != kInSlot) return std::nullopt;
  // From here on the shard's gradient is taken: no spill, no re-send (the
  // barrier takes a shard stepped early as done).
  grad_at_[rank][index] = step_certain ? kStoring : kStepped;
  StepHooks hooks;
  // The pass steps its shards one after another into the two stagings in
  // turn (the step's own pass runs apart from it: both hold the job's
  // states lock).
  hooks.param_target = [this](const ShardId&) { return EarlyStaging(); };
  if (step_certain) {
    // Nothing can skip the step now and no trainer acquires before it ends:
    // stored as the step's own pass stores its shards, so a model within
    // the budget keeps its params in the window for the next forward.
    hooks.shard_done = [this, &job_mu, rank, index, slot](const ShardId&) -> absl::Status {
      const std::byte* staged = EarlyStaging();
      STRATA_RETURN_IF_ERROR(WaitEarlyWrite());  // the renames below need every pending write landed
      if (!update_begun_) {
        param_cache_->BeginUpdate();
        update_begun_ = true;
        STRATA_RETURN_IF_ERROR(StoreSteppedParams(job_mu));
      }
      FreeGradSlot(job_mu, rank, index, slot, kNowhere);
      return param_cache_->StoreHomeFrom(rank, index, absl::MakeConstSpan(staged, dtypes_.ParamSlotBytes(slot)));
    };
    return hooks;
  }
  hooks.shard_done = [this, &job_mu, rank, index, slot](const ShardId&) -> absl::Status {
    const std::byte* staged = EarlyStaging();
    // The previous shard's write: the other staging is the next shard's.
    STRATA_RETURN_IF_ERROR(WaitEarlyWrite());
    const auto params = absl::MakeConstSpan(staged, dtypes_.ParamSlotBytes(slot));
    early_write_ = std::async(std::launch::async, [this, rank, index, params] {
      absl::Status written = nvme_->Write(SteppedKey(job_id_, rank, index), params);
      if (written.ok()) return written;
      return absl::Status(written.code(), absl::StrCat("writing the early-stepped params of shard ", index,
                                                       " of rank ", rank, " to NVMe: ", written.message()));
    });
    early_staging_ ^= 1;
    // The gradient is consumed and the params are in the staging: the
    // slot's memory goes back now, and the rank's trainer may write the
    // next one. (The step starts only after EndEarlyPass, so the params are
    // on NVMe when StoreSteppedParams looks for them.)
    FreeGradSlot(job_mu, rank, index, slot, kStepped);
    return absl::OkStatus();
  };
  return hooks;
}

std::byte* InfinityPipeline::EarlyStaging() {
  return (early_staging_ == 0 ? param_staging_ : param_staging_alt_).data();
}

void InfinityPipeline::EndBegunUpdate() {
  if (!update_begun_) return;
  param_cache_->EndUpdate();
  update_begun_ = false;
}

absl::Status InfinityPipeline::WaitEarlyWrite() {
  if (!early_write_.valid()) return absl::OkStatus();
  return early_write_.get();
}

absl::Status InfinityPipeline::EndEarlyPass(bool failed) {
  absl::Status written = WaitEarlyWrite();
  // A failed pass fails the step, which then neither runs nor ends: the
  // update ends here (the job reloads its params from its last commit).
  if (failed) EndBegunUpdate();
  return written;
}

absl::Status InfinityPipeline::StoreSteppedParams(absl::Mutex& job_mu) {
  std::vector<std::pair<uint32_t, uint32_t>> stepped;
  {
    absl::MutexLock lock(&job_mu);
    for (uint32_t rank = 0; rank < grad_at_.size(); ++rank) {
      for (uint32_t i = 0; i < grad_at_[rank].size(); ++i) {
        if (grad_at_[rank][i] == kStepped) stepped.emplace_back(rank, i);
      }
    }
  }
  for (const auto& [rank, index] : stepped) {
    const ShardKey pending = SteppedKey(job_id_, rank, index);
    absl::Status installed = param_cache_->InstallHome(rank, index, pending);
    if (absl::IsFailedPrecondition(installed)) {
      // A copy pinned or moving (not during an update, but cheap to
      // survive): read back and stored the way the step stores params.
      const uint64_t bytes = regions_->ParamShard(rank, index).second;
      absl::StatusOr<uint64_t> got = nvme_->Read(pending, param_staging_.span());
      installed = got.ok() ? param_cache_->StoreHomeFrom(rank, index, absl::MakeConstSpan(param_staging_.data(), bytes))
                           : got.status();
      if (installed.ok()) installed = nvme_->Delete(pending);
    }
    STRATA_RETURN_IF_ERROR(installed);
    absl::MutexLock lock(&job_mu);
    grad_at_[rank][index] = kNowhere;
  }
  return absl::OkStatus();
}

void InfinityPipeline::FreeGradSlot(absl::Mutex& job_mu, uint32_t rank, uint32_t index, const ExchangeSlot& slot,
                                    GradAt now) {
  regions_->DiscardGradSlot(rank, slot);
  uint64_t reserved;
  {
    absl::MutexLock lock(&job_mu);
    grad_at_[rank][index] = now;
    grad_resident_bytes_ -= dtypes_.GradSlotBytes(slot);
    grad_held_[rank] -= dtypes_.GradSlotBytes(slot);
    reserved = grad_resident_bytes_;
  }
  param_cache_->SetReserved(reserved);
}

StepHooks InfinityPipeline::BeginStep(absl::Mutex& job_mu, const std::vector<ShardId>& ids,
                                      const std::vector<std::vector<ExchangeSlot>>& slots) {
  // Begun already when an early pass stepped shards once the step was certain.
  if (!update_begun_) param_cache_->BeginUpdate();
  update_begun_ = false;  // EndStep ends it
  {
    absl::MutexLock lock(&job_mu);
    step_grad_at_ = grad_at_;
  }
  step_grad_at_.resize(slots.size());
  step_slots_ = &slots;
  // Spilled gradients come back in step order, the next one read while the
  // step works on this one.
  std::vector<std::pair<ShardId, uint64_t>> spilled;
  for (const ShardId& id : ids) {
    if (step_grad_at_[id.rank][id.index] == kSpilled) {
      spilled.emplace_back(id, dtypes_.GradSlotBytes(slots[id.rank][id.index]));
    }
  }
  grad_spill_->BeginReadback(std::move(spilled));
  StepHooks hooks;
  hooks.before_shards = [this, &job_mu] { return StoreSteppedParams(job_mu); };
  hooks.grad_source = [this](const ShardId& id) -> absl::StatusOr<const std::byte*> {
    if (step_grad_at_[id.rank][id.index] == kSpilled) return grad_spill_->Next(id);
    return regions_->GradSlot(id.rank, (*step_slots_)[id.rank][id.index]);
  };
  // New params go to the staging. The window: as each shard is stepped its
  // gradient slot is freed and its new params go home; the cache keeps the
  // param slot only within the budget, so the step never has every slot in
  // memory at once.
  hooks.param_target = [this](const ShardId&) { return param_staging_.data(); };
  hooks.shard_done = [this, &job_mu](const ShardId& id) {
    const ExchangeSlot& slot = (*step_slots_)[id.rank][id.index];
    if (step_grad_at_[id.rank][id.index] == kInSlot) FreeGradSlot(job_mu, id.rank, id.index, slot, kNowhere);
    const uint64_t bytes = dtypes_.ParamSlotBytes(slot);
    return param_cache_->StoreHomeFrom(id.rank, id.index, absl::MakeConstSpan(param_staging_.data(), bytes));
  };
  return hooks;
}

void InfinityPipeline::EndStep(absl::Mutex& job_mu) {
  param_cache_->EndUpdate();
  // Before the commit: no spilled copy may become durable.
  ClearGradsAfterStep(job_mu);
  step_slots_ = nullptr;
}

void InfinityPipeline::SkipStep(absl::Mutex& job_mu) {
  // (An update an early pass began is for a step that cannot be skipped;
  // ended here all the same, so Acquire never waits for it.)
  EndBegunUpdate();
  ClearGradsAfterStep(job_mu);
}

void InfinityPipeline::ClearGradsAfterStep(absl::Mutex& job_mu) {
  std::vector<std::pair<uint32_t, uint32_t>> in_slot, stepped;
  {
    absl::MutexLock lock(&job_mu);
    for (uint32_t rank = 0; rank < grad_at_.size(); ++rank) {
      std::vector<GradAt>& at = grad_at_[rank];
      for (uint32_t i = 0; i < at.size(); ++i) {
        // kStoring: a failed pass left the shard's gradient in its slot.
        if (at[i] == kInSlot || at[i] == kStoring) in_slot.emplace_back(rank, i);
        if (at[i] == kStepped) stepped.emplace_back(rank, i);
        at[i] = kNowhere;
      }
    }
    grad_resident_bytes_ = 0;
    std::fill(grad_held_.begin(), grad_held_.end(), 0);
    grad_bytes_read_back_ = grad_spill_->read_back_bytes();
  }
  // The step consumed them; the next step's gradients are written anew.
  for (const auto& [rank, index] : in_slot) regions_->DiscardGradSlot(rank, index);
  // A skipped or failed step's early params (a rollback dropped them
  // already, being uncommitted writes; a delete of what is left makes it
  // net nothing in the next commit).
  for (const auto& [rank, index] : stepped) {
    const ShardKey pending = SteppedKey(job_id_, rank, index);
    (void)nvme_->Delete(pending);  // NotFound once rolled back
  }
  param_cache_->SetReserved(0);
  grad_spill_->EndReadback();
  grad_spill_->DeleteAll();
}

}  // namespace strata
