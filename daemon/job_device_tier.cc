#include "daemon/job_device_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"
#include "core/status_macros.h"

namespace strata {

JobDeviceArena::~JobDeviceArena() { tier_->Release(job_); }

absl::StatusOr<std::unique_ptr<JobDeviceTier>> JobDeviceTier::Create(Device* device,
                                                                     const JobDeviceTierOptions& options) {
  const uint64_t align = options.slot_alignment_bytes;
  if (align == 0 || (align & (align - 1)) != 0) {
    return absl::InvalidArgumentError("device tier: slot alignment must be a power of two");
  }
  if (options.capacity_bytes == 0) return absl::InvalidArgumentError("device tier: capacity must be positive");
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<DeviceSlotCopier> copier, DeviceSlotCopier::Create(device, options.streams));
  return std::unique_ptr<JobDeviceTier>(new JobDeviceTier(device, options, std::move(copier)));
}

JobDeviceTier::JobDeviceTier(Device* device, const JobDeviceTierOptions& options,
                             std::unique_ptr<DeviceSlotCopier> copier)
    : device_(device),
      options_(options),
      copier_(std::move(copier)),
      name_(absl::StrCat("device (", device->info().name, ")")) {}

JobDeviceTier::~JobDeviceTier() {
  // The store (and every Job) is gone before the tier: free what is left.
  absl::MutexLock lock(&mu_);
  for (auto& [job, arena] : arenas_) device_->Free(arena->buffer);
  arenas_.clear();
}

absl::StatusOr<std::unique_ptr<JobDeviceArena>> JobDeviceTier::OpenJob(JobId job, uint64_t budget_bytes) {
  if (budget_bytes == 0) return absl::InvalidArgumentError("device tier: a job arena of 0 bytes");
  absl::MutexLock lock(&mu_);
  if (auto it = arenas_.find(job); it != arenas_.end()) {
    if (it->second->budget != budget_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("device tier: job ", job.value(), " already has an arena for ",
                                                     it->second->budget, " bytes, not ", budget_bytes));
    }
    ++it->second->leases;
    return std::unique_ptr<JobDeviceArena>(new JobDeviceArena(this, job));
  }
  // The arena is the budget rounded up to the slot alignment, and the
  // device holds exactly the capacity, so the rounded sizes are what must fit.
  const uint64_t align = options_.slot_alignment_bytes;
  const uint64_t arena_bytes = budget_bytes > options_.capacity_bytes ? budget_bytes : FootprintBytes(budget_bytes);
  if (arena_bytes > options_.capacity_bytes - arena_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device tier: an arena for ", FormatBytes(budget_bytes), " for job ", job.value(), " (",
        FormatBytes(arena_bytes), " rounded up to ", FormatBytes(align), ") does not fit: ",
        FormatBytes(options_.capacity_bytes - arena_bytes_), " of --device_capacity ",
        FormatBytes(options_.capacity_bytes), " left"));
  }
  absl::StatusOr<DeviceBuffer> buffer = device_->Allocate(arena_bytes);
  if (!buffer.ok()) {
    return absl::Status(buffer.status().code(), absl::StrCat("device tier: carving the arena of job ", job.value(),
                                                             " (", FormatBytes(budget_bytes),
                                                             "): ", buffer.status().message()));
  }
  auto arena = std::make_unique<Arena>(*buffer, budget_bytes, align);
  absl::StatusOr<DeviceExport> share = device_->Export(*buffer);
  if (!share.ok()) {
    device_->Free(*buffer);
    return absl::Status(share.status().code(),
                        absl::StrCat("device tier: sharing job ", job.value(), "'s arena: ", share.status().message()));
  }
  arena->share = *share;
  if (share->kind == DeviceExport::Kind::kMemfd && options_.read_only_memfd) {
    // A read-only open of the job's memfd: what its trainers get, so no
    // trainer can write into shards behind the daemon.
    const std::string path = absl::StrCat("/proc/self/fd/", share->memfd);
    arena->read_only_fd = UniqueFd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!arena->read_only_fd.valid()) {
      const int err = errno;
      device_->Free(*buffer);
      return absl::InternalError(absl::StrCat("device tier: reopening job ", job.value(), "'s arena read-only (", path,
                                              ") failed: ", strerror(err)));
    }
  }
  arena->leases = 1;
  arena_bytes_ += arena_bytes;
  budget_bytes_ += budget_bytes;
  arenas_.emplace(job, std::move(arena));
  return std::unique_ptr<JobDeviceArena>(new JobDeviceArena(this, job));
}

void JobDeviceTier::Release(JobId job) {
  absl::MutexLock lock(&mu_);
  auto it = arenas_.find(job);
  if (it == arenas_.end()) return;
  --it->second->leases;
  MaybeFreeLocked(job);
}

void JobDeviceTier::MaybeFreeLocked(JobId job) {
  auto it = arenas_.find(job);
  if (it == arenas_.end() || it->second->leases > 0 || it->second->slots.used_bytes() > 0) return;
  // No slot is left, so no copy on the buffer is queued.
  device_->Free(it->second->buffer);
  arena_bytes_ -= it->second->buffer.size_bytes;
  budget_bytes_ -= it->second->budget;
  arenas_.erase(it);
}

absl::StatusOr<JobArenaShare> JobDeviceTier::Share(JobId job) const {
  absl::MutexLock lock(&mu_);
  auto it = arenas_.find(job);
  if (it == arenas_.end() || it->second->leases == 0) {
    return absl::NotFoundError(absl::StrCat("device tier: job ", job.value(), " has no device arena"));
  }
  JobArenaShare out;
  out.device = it->second->share;
  out.bytes = it->second->buffer.size_bytes;
  if (it->second->read_only_fd.valid()) {
    out.read_only_fd = UniqueFd(fcntl(it->second->read_only_fd.get(), F_DUPFD_CLOEXEC, 0));
    if (!out.read_only_fd.valid()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("device tier: duplicating job ", job.value(), "'s arena descriptor: ", strerror(errno)));
    }
  }
  return out;
}

uint64_t JobDeviceTier::arena_bytes() const {
  absl::MutexLock lock(&mu_);
  return arena_bytes_;
}

uint64_t JobDeviceTier::budget_bytes() const {
  absl::MutexLock lock(&mu_);
  return budget_bytes_;
}

size_t JobDeviceTier::arena_count() const {
  absl::MutexLock lock(&mu_);
  return arenas_.size();
}

uint64_t JobDeviceTier::ArenaBytesOf(JobId job) const {
  absl::MutexLock lock(&mu_);
  auto it = arenas_.find(job);
  return it == arenas_.end() ? 0 : it->second->buffer.size_bytes;
}

uint64_t JobDeviceTier::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_bytes_;
}

uint64_t JobDeviceTier::FootprintBytes(uint64_t size_bytes) const {
  const uint64_t align = options_.slot_alignment_bytes;
  return (std::max<uint64_t>(size_bytes, 1) + align - 1) & ~(align - 1);
}

absl::StatusOr<TierSlot> JobDeviceTier::Allocate(const ShardKey& key, uint64_t size_bytes) {
  absl::MutexLock lock(&mu_);
  auto it = arenas_.find(key.job);
  if (it == arenas_.end() || it->second->leases == 0) {
    return absl::FailedPreconditionError(absl::StrCat(name_, ": ", ShardKeyToString(key), ": job ", key.job.value(),
                                                      " has no device arena (no device budget)"));
  }
  absl::StatusOr<SlotRange> range = it->second->slots.Allocate(size_bytes);
  if (!range.ok()) {
    // The allocator's message starts with "fragmented" or "full".
    return absl::ResourceExhaustedError(absl::StrCat(name_, ": no room for ", ShardKeyToString(key),
                                                     " in its job's arena of ",
                                                     FormatBytes(it->second->buffer.size_bytes), ": ",
                                                     range.status().message()));
  }
  const uint64_t id = next_slot_id_++;
  slots_.emplace(id, SlotInfo{key.job, *range});
  used_bytes_ += range->size_bytes;
  return TierSlot{id, range->offset_bytes, size_bytes, range->size_bytes};
}

void JobDeviceTier::Free(const TierSlot& slot) {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(slot.id);
  if (it == slots_.end()) return;
  const SlotInfo info = it->second;
  slots_.erase(it);
  used_bytes_ -= info.range.size_bytes;
  auto arena = arenas_.find(info.job);
  if (arena == arenas_.end()) return;
  arena->second->slots.Free(info.range);
  MaybeFreeLocked(info.job);
}

std::optional<Tier::FreeSpace> JobDeviceTier::FreeSpaceFor(const ShardKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = arenas_.find(key.job);
  if (it == arenas_.end()) return std::nullopt;
  return FreeSpace{it->second->slots.free_bytes(), it->second->slots.largest_free_bytes()};
}

uint64_t JobDeviceTier::FreeRangeAfterFreeing(const TierSlot& slot) const {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(slot.id);
  if (it == slots_.end()) return 0;
  return arenas_.at(it->second.job)->slots.FreeRangeAfterFreeing(it->second.range);
}

absl::StatusOr<DeviceBuffer> JobDeviceTier::BufferOf(const TierSlot& slot) const {
  absl::MutexLock lock(&mu_);
  auto it = slots_.find(slot.id);
  if (it == slots_.end()) return absl::InvalidArgumentError(absl::StrCat(name_, ": unknown slot ", slot.id));
  // The slot holds its arena alive, so the buffer stays valid after unlock.
  return arenas_.at(it->second.job)->buffer;
}

absl::Status JobDeviceTier::Write(const TierSlot& slot, absl::Span<const std::byte> src) {
  STRATA_ASSIGN_OR_RETURN(DeviceBuffer buffer, BufferOf(slot));
  return copier_->ToDevice(buffer, slot, src, name_);
}

absl::Status JobDeviceTier::Read(const TierSlot& slot, absl::Span<std::byte> dst) {
  STRATA_ASSIGN_OR_RETURN(DeviceBuffer buffer, BufferOf(slot));
  return copier_->ToHost(dst, buffer, slot, name_);
}

}  // namespace strata
