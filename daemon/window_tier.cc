#include "daemon/window_tier.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"

namespace strata {

absl::Status WindowTier::AddJob(JobId job, Locate locate, Discard discard) {
  auto windows = std::make_shared<JobWindows>();
  windows->locate = std::move(locate);
  windows->discard = std::move(discard);
  absl::MutexLock lock(&mu_);
  if (!jobs_.emplace(job, std::move(windows)).second) {
    return absl::AlreadyExistsError(absl::StrCat("job ", job.value(), "'s windows are already in the pinned tier"));
  }
  return absl::OkStatus();
}

void WindowTier::RemoveJob(JobId job) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job);
}

uint64_t WindowTier::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_bytes_;
}

uint64_t WindowTier::FootprintBytes(uint64_t size_bytes) const {
  constexpr uint64_t kPage = 4096;
  return (std::max<uint64_t>(size_bytes, 1) + kPage - 1) / kPage * kPage;
}

absl::StatusOr<TierSlot> WindowTier::Allocate(const ShardKey& key, uint64_t size_bytes) {
  std::shared_ptr<const JobWindows> job;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(key.job);
    if (it == jobs_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("pinned tier: ", ShardKeyToString(key), ": its job has no window here"));
    }
    job = it->second;
  }
  const WindowSlot where = job->locate(key.rank.value(), key.tensor.value());
  if (where.data == nullptr || size_bytes > where.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("pinned tier: ", ShardKeyToString(key), " (", size_bytes,
                                                   " bytes) does not fit its window slot of ", where.bytes));
  }
  const uint64_t footprint = FootprintBytes(size_bytes);
  absl::MutexLock lock(&mu_);
  if (used_bytes_ + footprint > capacity_bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pinned tier: no room for ", ShardKeyToString(key), " (", FormatBytes(footprint), "): ",
        FormatBytes(used_bytes_), " of ", FormatBytes(capacity_bytes()), " used"));
  }
  used_bytes_ += footprint;
  const uint64_t id = next_slot_id_++;
  slots_[id] = Allocated{job, key.rank.value(), key.tensor.value(), where.data};
  return TierSlot{id, where.offset, size_bytes, footprint};
}

void WindowTier::Free(const TierSlot& slot) {
  Allocated freed;
  {
    absl::MutexLock lock(&mu_);
    auto it = slots_.find(slot.id);
    if (it == slots_.end()) return;
    freed = std::move(it->second);
    slots_.erase(it);
    used_bytes_ -= slot.footprint_bytes;
  }
  // The slot's contents are not needed any more: its pages go back.
  if (freed.job->discard) freed.job->discard(freed.rank, freed.index);
}

absl::StatusOr<WindowTier::Allocated> WindowTier::Find(const TierSlot& slot) const {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(slot.id);
  if (it == slots_.end()) return absl::InvalidArgumentError(absl::StrCat("pinned tier: unknown slot ", slot.id));
  return it->second;
}

absl::Status WindowTier::Write(const TierSlot& slot, absl::Span<const std::byte> src) {
  absl::StatusOr<Allocated> a = Find(slot);
  if (!a.ok()) return a.status();
  if (src.size() != slot.size_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned tier: writing ", src.size(), " bytes into a slot of ", slot.size_bytes));
  }
  std::memcpy(a->data, src.data(), src.size());
  return absl::OkStatus();
}

absl::Status WindowTier::Read(const TierSlot& slot, absl::Span<std::byte> dst) {
  absl::StatusOr<Allocated> a = Find(slot);
  if (!a.ok()) return a.status();
  if (dst.size() < slot.size_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned tier: reading a slot of ", slot.size_bytes, " bytes into ", dst.size()));
  }
  std::memcpy(dst.data(), a->data, slot.size_bytes);
  return absl::OkStatus();
}

absl::Span<std::byte> WindowTier::HostView(const TierSlot& slot) {
  absl::StatusOr<Allocated> a = Find(slot);
  if (!a.ok()) return {};
  return absl::Span<std::byte>(a->data, slot.size_bytes);
}

}  // namespace strata
