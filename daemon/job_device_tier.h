// JobDeviceTier: the daemon's device tier, carved into one arena per job.
//
// The daemon shares device memory with trainers (a read-only memfd mapping
// when emulated, a CUDA IPC handle on a GPU). A handle names a whole
// allocation, so one arena for every job would let a trainer of job A read
// job B's params. Here each job with a device budget gets its own device
// allocation of its budget (OpenJob), sub-allocated into that job's shard
// slots by its own SlotAllocator; a trainer is handed only its job's
// allocation (Share). A slot's offset_bytes is its offset in its job's
// arena, so a job's slots can never reach beyond its own arena.
//
// An arena is exactly the job's budget, rounded up to the slot alignment:
// device memory is the admitted budgets and nothing more. The TieredStore
// charges a job's device copies by footprint against its budget, and first
// fit over shards of mixed sizes can still refuse a slot the budget allows
// (a 96 KiB arena with 32 KiB free whose largest range is 24 KiB). Allocate
// says which case a refusal is ("fragmented" or "full", and FreeSpaceFor
// gives the numbers), and the store mends fragmentation by evicting more of
// that job's unpinned copies, preferring those whose freeing leaves a long
// enough range (FreeRangeAfterFreeing), and retrying -- never another job's
// copies (they are in another arena anyway) and never moving a slot a
// trainer may hold. What pinned copies fragment, eviction cannot mend, so
// each arena places large slots from the bottom and small ones from the
// top (SlotAllocator::Placement::kTwoEnded), which makes it rare; a job
// whose trainers pin nearly its whole budget at once still needs a budget
// with room over that (docs/DAEMON.md, "Device tier"). (Until 2026-12-02
// each arena was twice its budget instead, so half of the device memory the
// daemon reserved was headroom.)
//
// It stays one Tier, so the daemon keeps one TieredStore for every job:
// Allocate picks the arena by ShardKey::job (FailedPrecondition for a job
// with no arena open). The sum of the open arenas is bounded by the tier's
// capacity (--device_capacity); JobRegistry admits budgets against it first.
//
// An arena lives while its lease (JobDeviceArena, held by the Job) lives or
// a slot is still allocated in it: the daemon's store may free a deleted
// job's last slots after the Job is gone, and the allocation goes with the
// last of them. A restored copy of a job that opens its id again while the
// old copy still holds the arena shares it (same job, same owner).
//
// Thread-safe.
#ifndef STRATA_DAEMON_JOB_DEVICE_TIER_H_
#define STRATA_DAEMON_JOB_DEVICE_TIER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/ids.h"
#include "core/unix_socket.h"
#include "tiers/device.h"
#include "tiers/device_slot_copier.h"
#include "tiers/slot_allocator.h"
#include "tiers/tier.h"

namespace strata {

class JobDeviceTier;

// What a trainer session of one job maps: that job's arena only.
struct JobArenaShare {
  DeviceExport device;  // kMemfd (device.memfd is the daemon's, not to send) or kCudaIpc
  // kMemfd: a read-only descriptor of the job's memfd, owned by the caller
  // (dup'ed, so it stays valid if the job is deleted meanwhile).
  UniqueFd read_only_fd;
  uint64_t bytes = 0;  // the arena's size: the job's budget rounded up to the slot alignment
};

// The job's hold on its arena; releasing it frees the arena once its last
// slot is freed.
class JobDeviceArena {
 public:
  ~JobDeviceArena();
  JobDeviceArena(const JobDeviceArena&) = delete;
  JobDeviceArena& operator=(const JobDeviceArena&) = delete;
  JobId job() const { return job_; }

 private:
  friend class JobDeviceTier;
  JobDeviceArena(JobDeviceTier* tier, JobId job) : tier_(tier), job_(job) {}
  JobDeviceTier* const tier_;
  const JobId job_;
};

struct JobDeviceTierOptions {
  // The sum of all arenas (budgets rounded up to the slot alignment); > 0.
  // The device must hold this much.
  uint64_t capacity_bytes = 0;
  uint64_t slot_alignment_bytes = 4096;
  int streams = 4;
  // Emulated memfd arenas: also open a read-only descriptor per arena for
  // the fd socket (only the daemon writes shards).
  bool read_only_memfd = true;
};

class JobDeviceTier final : public Tier {
 public:
  // `device` is borrowed and outlives the tier. InvalidArgument for bad
  // options.
  static absl::StatusOr<std::unique_ptr<JobDeviceTier>> Create(Device* device, const JobDeviceTierOptions& options);
  ~JobDeviceTier() override;

  // Carves (or joins) `job`'s arena for `budget_bytes` (> 0; the arena is
  // that, rounded up to the slot alignment). ResourceExhausted when the open
  // arenas plus this one exceed the capacity or the device has no room;
  // InvalidArgument when an arena of another budget is open for the id.
  absl::StatusOr<std::unique_ptr<JobDeviceArena>> OpenJob(JobId job, uint64_t budget_bytes);
  // How a trainer of `job` maps its arena. NotFound when none is open.
  absl::StatusOr<JobArenaShare> Share(JobId job) const;

  // Bytes of device memory carved into arenas, the budgets they were carved
  // for, and how many are open.
  uint64_t arena_bytes() const;
  uint64_t budget_bytes() const;
  size_t arena_count() const;
  // The size of `job`'s arena (0: none).
  uint64_t ArenaBytesOf(JobId job) const;

  TierKind kind() const override { return TierKind::kDevice; }
  absl::string_view name() const override { return name_; }
  uint64_t capacity_bytes() const override { return options_.capacity_bytes; }
  uint64_t used_bytes() const override;
  uint64_t FootprintBytes(uint64_t size_bytes) const override;
  absl::StatusOr<TierSlot> Allocate(const ShardKey& key, uint64_t size_bytes) override;
  void Free(const TierSlot& slot) override;
  absl::Status Write(const TierSlot& slot, absl::Span<const std::byte> src) override;
  absl::Status Read(const TierSlot& slot, absl::Span<std::byte> dst) override;
  // The free bytes and the largest free range of key.job's arena (nullopt
  // when it has none).
  std::optional<FreeSpace> FreeSpaceFor(const ShardKey& key) const override;
  uint64_t FreeRangeAfterFreeing(const TierSlot& slot) const override;

 private:
  friend class JobDeviceArena;
  struct Arena {
    Arena(DeviceBuffer b, uint64_t budget_bytes, uint64_t align)
        : buffer(b), budget(budget_bytes), slots(b.size_bytes, align, SlotAllocator::Placement::kTwoEnded) {}
    DeviceBuffer buffer;
    uint64_t budget;
    SlotAllocator slots;
    DeviceExport share;
    UniqueFd read_only_fd;
    int leases = 0;
  };
  struct SlotInfo {
    JobId job;
    SlotRange range;
  };
  JobDeviceTier(Device* device, const JobDeviceTierOptions& options, std::unique_ptr<DeviceSlotCopier> copier);
  void Release(JobId job);
  // Frees the arena when no lease nor slot holds it.
  void MaybeFreeLocked(JobId job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<DeviceBuffer> BufferOf(const TierSlot& slot) const;

  Device* const device_;
  const JobDeviceTierOptions options_;
  const std::unique_ptr<DeviceSlotCopier> copier_;
  const std::string name_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<JobId, std::unique_ptr<Arena>> arenas_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, SlotInfo> slots_ ABSL_GUARDED_BY(mu_);
  uint64_t arena_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t budget_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_slot_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace strata

#endif  // STRATA_DAEMON_JOB_DEVICE_TIER_H_
