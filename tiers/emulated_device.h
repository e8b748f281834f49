// EmulatedDevice: a Device made of host memory, so the device tier, the store
// and the prefetcher run (and are tested) on machines without a GPU.
//
// Capacity is enforced like a GPU's: Allocate fails with ResourceExhausted
// past `capacity_bytes`, so a device of a few MiB makes eviction run in every
// test. Copies are performed when they are queued (which keeps per-stream
// order trivially), and, when a bandwidth or latency is configured, each copy
// also spends `latency + bytes / bandwidth` on the borrowed Clock: with a
// FakeClock that advances simulated time exactly, with a RealClock it sleeps.
// Faults can be injected: the n-th allocation or copy fails.
//
// With `shared_memory` each allocation is its own memfd, mapped shared, and
// Export hands out that memfd: another process (a trainer of the daemon's
// device arena) maps the same bytes, as it would open a CUDA IPC handle on a
// GPU. Its pages exist only once written (ftruncate'd, not populated), so a
// large emulated arena costs only what is stored in it.
//
// Thread-safe.
#ifndef STRATA_TIERS_EMULATED_DEVICE_H_
#define STRATA_TIERS_EMULATED_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/clock.h"
#include "tiers/device.h"

namespace strata {

struct EmulatedDeviceOptions {
  uint64_t capacity_bytes = 64ull << 20;
  // Copy cost model; both zero means copies take no modelled time.
  double bandwidth_bytes_per_second = 0;  // 0: unlimited
  absl::Duration latency = absl::ZeroDuration();
  // Borrowed; must outlive the device. Required when a cost is modelled.
  Clock* clock = nullptr;
  // Fault injection: the n-th (1-based) call fails; 0 never.
  uint64_t fail_allocation_number = 0;
  uint64_t fail_copy_number = 0;
  // Each allocation a memfd that Export shares (see above).
  bool shared_memory = false;
};

class EmulatedDevice final : public Device {
 public:
  // InvalidArgument when capacity is 0, bandwidth negative, or a cost is
  // modelled without a clock.
  static absl::StatusOr<std::unique_ptr<EmulatedDevice>> Create(
      const EmulatedDeviceOptions& options);

  const DeviceInfo& info() const override { return info_; }
  uint64_t allocated_bytes() const override;
  absl::StatusOr<DeviceBuffer> Allocate(uint64_t size_bytes) override;
  void Free(DeviceBuffer buffer) override;
  absl::StatusOr<StreamId> CreateStream() override;
  absl::Status CopyToDevice(DeviceBuffer dst, uint64_t dst_offset_bytes, const void* src,
                            uint64_t size_bytes, StreamId stream) override;
  absl::Status CopyToHost(void* dst, DeviceBuffer src, uint64_t src_offset_bytes,
                          uint64_t size_bytes, StreamId stream) override;
  absl::StatusOr<EventId> RecordEvent(StreamId stream) override;
  absl::Status WaitEvent(EventId event) override;
  // kMemfd of the buffer's memfd (offset 0); Unimplemented without
  // shared_memory, InvalidArgument for an unknown buffer.
  absl::StatusOr<DeviceExport> Export(DeviceBuffer buffer) const override;

  // Total modelled copy time so far (zero without a cost model).
  absl::Duration modelled_copy_time() const;

 private:
  // One allocation: heap memory, or a shared memfd mapping.
  class Memory {
   public:
    static absl::StatusOr<Memory> Make(uint64_t size_bytes, bool shared);
    Memory(Memory&& other) noexcept;
    Memory& operator=(Memory&& other) noexcept;
    Memory(const Memory&) = delete;
    Memory& operator=(const Memory&) = delete;
    ~Memory();
    std::byte* data() const { return data_; }
    uint64_t size() const { return size_; }
    int fd() const { return fd_; }

   private:
    Memory() = default;
    void Reset();
    std::unique_ptr<std::byte[]> heap_;
    std::byte* data_ = nullptr;
    uint64_t size_ = 0;
    int fd_ = -1;  // shared: the memfd, and data_ its mapping
  };

  explicit EmulatedDevice(const EmulatedDeviceOptions& options);
  // Resolves `buffer` + range to host memory, or InvalidArgument.
  absl::StatusOr<std::byte*> Resolve(DeviceBuffer buffer, uint64_t offset_bytes,
                                     uint64_t size_bytes, StreamId stream)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Copy(bool to_device, void* host, DeviceBuffer buffer, uint64_t offset_bytes,
                    uint64_t size_bytes, StreamId stream);

  const EmulatedDeviceOptions options_;
  const DeviceInfo info_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Memory> buffers_ ABSL_GUARDED_BY(mu_);
  uint64_t allocated_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_handle_ ABSL_GUARDED_BY(mu_) = 1;
  uint32_t streams_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_event_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, absl::Status> events_ ABSL_GUARDED_BY(mu_);
  uint64_t allocations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t copies_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration modelled_copy_time_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_TIERS_EMULATED_DEVICE_H_
