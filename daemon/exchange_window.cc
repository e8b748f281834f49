#include "daemon/exchange_window.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/status_macros.h"

namespace strata {
namespace {

constexpr uint64_t kPage = 4096;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// Fills every slot's group_runs from the tensors' groups. The ranges were
// checked against the tensors before (Job::AdmitPartitionLocked); a range
// naming a tensor without a group is still refused here, never indexed.
absl::Status ComputeGroupRuns(std::vector<ExchangeSlot>& slots, const std::vector<uint32_t>& group_of) {
  for (ExchangeSlot& slot : slots) {
    std::vector<GroupRun>& runs = slot.group_runs;
    runs.clear();
    // Ranges are sorted by shard_offset; a gap (padding) joins the run before it.
    for (const OwnedRange& r : slot.layout.ranges) {
      if (r.tensor.value() >= group_of.size()) {
        return absl::InvalidArgumentError(absl::StrCat("shard ", slot.layout.index, " has a range of tensor ",
                                                       r.tensor.value(), "; the job has ", group_of.size(),
                                                       " tensors"));
      }
      const uint32_t group = group_of[r.tensor.value()];
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
  return absl::OkStatus();
}

}  // namespace

uint64_t SlotDTypes::ParamSlotBytes(const ExchangeSlot& slot) const {
  return RoundUp(slot.layout.padded_numel * DTypeSize(param), kPage);
}

uint64_t SlotDTypes::GradSlotBytes(const ExchangeSlot& slot) const {
  return RoundUp(slot.layout.padded_numel * DTypeSize(grad), kPage);
}

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

absl::StatusOr<ExchangeLayout> LayOutExchange(std::vector<ShardLayout> shards, const SlotDTypes& dtypes,
                                              const std::vector<uint32_t>& group_of) {
  const uint64_t grad_bytes = DTypeSize(dtypes.grad);
  const uint64_t param_bytes = DTypeSize(dtypes.param);
  ExchangeLayout out;
  uint64_t offset = 0;
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
    slot.layout = std::move(shard);
    out.slots.push_back(std::move(slot));
  }
  out.region_bytes = std::max<uint64_t>(offset, kPage);
  STRATA_RETURN_IF_ERROR(ComputeGroupRuns(out.slots, group_of));
  return out;
}

absl::Status ExchangeWindow::Map(ExchangeLayout layout, const std::string& name, bool populate) {
  PinnedArenaOptions options;
  options.name = name;
  options.size_bytes = layout.region_bytes;
  options.populate = populate;
  STRATA_ASSIGN_OR_RETURN(exchange, PinnedArena::Create(options));
  slots = std::move(layout.slots);
  return absl::OkStatus();
}

void ExchangeRegions::Publish(uint32_t rank, size_t ranks, ExchangeWindow& window) {
  absl::MutexLock lock(&mu_);
  if (published_.size() < ranks) published_.resize(ranks);
  published_[rank] = Published{window.exchange.data(), window.slots, &window.exchange};
}

void ExchangeRegions::Clear() {
  absl::MutexLock lock(&mu_);
  published_.clear();
}

std::byte* ExchangeRegions::GradSlot(uint32_t rank, const ExchangeSlot& slot) const {
  absl::MutexLock lock(&mu_);
  return published_[rank].base + slot.grad_offset;
}

std::byte* ExchangeRegions::ParamSlot(uint32_t rank, const ExchangeSlot& slot) const {
  absl::MutexLock lock(&mu_);
  return published_[rank].base + slot.param_offset;
}

std::pair<std::byte*, uint64_t> ExchangeRegions::ParamShard(uint32_t rank, uint32_t index) const {
  absl::MutexLock lock(&mu_);
  const Published& r = published_[rank];
  const ExchangeSlot& slot = r.slots[index];
  return {r.base + slot.param_offset, dtypes_.ParamSlotBytes(slot)};
}

void ExchangeRegions::DiscardParamSlot(uint32_t rank, uint32_t index) const {
  absl::MutexLock lock(&mu_);
  const Published& r = published_[rank];
  if (r.region == nullptr || index >= r.slots.size()) return;
  // A failed punch (it cannot fail on a memfd short of a kernel bug) only
  // leaves memory in use; the slot's contents are not needed either way.
  (void)r.region->Discard(r.slots[index].param_offset, dtypes_.ParamSlotBytes(r.slots[index]));
}

void ExchangeRegions::DiscardGradSlot(uint32_t rank, const ExchangeSlot& slot) const {
  absl::MutexLock lock(&mu_);
  const Published& r = published_[rank];
  if (r.region == nullptr) return;
  (void)r.region->Discard(slot.grad_offset, dtypes_.GradSlotBytes(slot));
}

void ExchangeRegions::DiscardGradSlot(uint32_t rank, uint32_t index) const {
  absl::MutexLock lock(&mu_);
  const Published& r = published_[rank];
  if (r.region == nullptr || index >= r.slots.size()) return;
  (void)r.region->Discard(r.slots[index].grad_offset, dtypes_.GradSlotBytes(r.slots[index]));
}

}  // namespace strata
