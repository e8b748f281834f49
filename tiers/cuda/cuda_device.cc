// CudaDevice: the Device over the CUDA runtime. One cudaMalloc arena per
// device, sub-allocated with SlotAllocator (or, with arena_bytes 0, one
// cudaMalloc per buffer, so each buffer's IPC handle opens only it); cudaMemcpyAsync on non-blocking
// streams; events created per record and destroyed once waited for. Every
// buffer is zeroed before it is handed out (see ZeroLocked).
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/byte_size.h"
#include "core/status_macros.h"
#include "tiers/cuda/cuda_status.h"
#include "tiers/cuda_device_factory.h"
#include "tiers/slot_allocator.h"

namespace strata {
namespace {

// 256 bytes: cudaMalloc's own alignment guarantee, kept for every slot
// so vectorized kernels can run on any shard.
constexpr uint64_t kSlotAlignment = 256;

class CudaDevice final : public Device {
 public:
  // `arena` null: a cudaMalloc per buffer, up to `capacity_bytes`.
  CudaDevice(int ordinal, DeviceInfo info, void* arena, uint64_t arena_bytes, uint64_t capacity_bytes)
      : ordinal_(ordinal),
        info_(std::move(info)),
        arena_(static_cast<std::byte*>(arena)),
        capacity_bytes_(capacity_bytes),
        allocator_(arena_bytes, kSlotAlignment) {}

  ~CudaDevice() override {
    // Errors here cannot be reported; the context is going away with us.
    cudaSetDevice(ordinal_);
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
    for (auto& [id, e] : events_) cudaEventDestroy(e);
    if (arena_ == nullptr) {
      for (auto& [handle, range] : ranges_) cudaFree(reinterpret_cast<void*>(handle));
    }
    cudaFree(arena_);
  }

  const DeviceInfo& info() const override { return info_; }

  uint64_t allocated_bytes() const override {
    absl::MutexLock lock(&mu_);
    return arena_ == nullptr ? own_bytes_ : allocator_.used_bytes();
  }

  absl::StatusOr<DeviceBuffer> Allocate(uint64_t size_bytes) override {
    if (size_bytes == 0) return absl::InvalidArgumentError("CUDA device: allocating 0 bytes");
    absl::MutexLock lock(&mu_);
    if (arena_ == nullptr) return AllocateOwnLocked(size_bytes);
    auto range = allocator_.Allocate(size_bytes);
    if (!range.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat(info_.name, ": device arena: ", range.status().message()));
    }
    std::byte* const memory = arena_ + range->offset_bytes;
    if (absl::Status zeroed = ZeroLocked(memory, size_bytes); !zeroed.ok()) {
      allocator_.Free(*range);
      return zeroed;
    }
    const uint64_t handle = reinterpret_cast<uint64_t>(memory);
    ranges_[handle] = *range;
    return DeviceBuffer{handle, size_bytes};
  }

  void Free(DeviceBuffer buffer) override {
    absl::MutexLock lock(&mu_);
    auto it = ranges_.find(buffer.handle);
    if (it == ranges_.end()) return;
    if (arena_ == nullptr) {
      // Errors cannot be reported; cudaFree synchronizes, which is fine for
      // a buffer freed when a job goes.
      cudaSetDevice(ordinal_);
      cudaFree(reinterpret_cast<void*>(buffer.handle));
      own_bytes_ -= it->second.size_bytes;
    } else {
      allocator_.Free(it->second);
    }
    ranges_.erase(it);
  }

  absl::StatusOr<StreamId> CreateStream() override {
    STRATA_RETURN_IF_ERROR(CudaToStatus(cudaSetDevice(ordinal_), "cudaSetDevice"));
    cudaStream_t stream;
    STRATA_RETURN_IF_ERROR(CudaToStatus(
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "creating a copy stream"));
    absl::MutexLock lock(&mu_);
    streams_.push_back(stream);
    return StreamId{static_cast<uint32_t>(streams_.size())};
  }

  absl::Status CopyToDevice(DeviceBuffer dst, uint64_t dst_offset_bytes, const void* src,
                            uint64_t size_bytes, StreamId stream) override {
    STRATA_ASSIGN_OR_RETURN(cudaStream_t s, Stream(stream));
    STRATA_RETURN_IF_ERROR(CheckRange(dst, dst_offset_bytes, size_bytes));
    void* device = reinterpret_cast<std::byte*>(dst.handle) + dst_offset_bytes;
    return CudaToStatus(cudaMemcpyAsync(device, src, size_bytes, cudaMemcpyHostToDevice, s),
                        "queueing a host-to-device copy");
  }

  absl::Status CopyToHost(void* dst, DeviceBuffer src, uint64_t src_offset_bytes,
                          uint64_t size_bytes, StreamId stream) override {
    STRATA_ASSIGN_OR_RETURN(cudaStream_t s, Stream(stream));
    STRATA_RETURN_IF_ERROR(CheckRange(src, src_offset_bytes, size_bytes));
    const void* device = reinterpret_cast<const std::byte*>(src.handle) + src_offset_bytes;
    return CudaToStatus(cudaMemcpyAsync(dst, device, size_bytes, cudaMemcpyDeviceToHost, s),
                        "queueing a device-to-host copy");
  }

  absl::StatusOr<EventId> RecordEvent(StreamId stream) override {
    STRATA_ASSIGN_OR_RETURN(cudaStream_t s, Stream(stream));
    cudaEvent_t event;
    STRATA_RETURN_IF_ERROR(CudaToStatus(
        cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "creating an event"));
    absl::Status recorded = CudaToStatus(cudaEventRecord(event, s), "recording an event");
    if (!recorded.ok()) {
      cudaEventDestroy(event);
      return recorded;
    }
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_event_++;
    events_[id] = event;
    return EventId{id};
  }

  // The IPC handle of the cudaMalloc allocation holding the buffer (IPC
  // handles name an allocation, not a range in it) and the buffer's offset
  // there: the whole device arena, or, without one, the buffer itself.
  absl::StatusOr<DeviceExport> Export(DeviceBuffer buffer) const override {
    {
      absl::MutexLock lock(&mu_);
      if (!ranges_.contains(buffer.handle)) return absl::InvalidArgumentError("CUDA device: unknown buffer");
    }
    STRATA_RETURN_IF_ERROR(CudaToStatus(cudaSetDevice(ordinal_), "cudaSetDevice"));
    std::byte* const base = arena_ != nullptr ? arena_ : reinterpret_cast<std::byte*>(buffer.handle);
    cudaIpcMemHandle_t handle;
    STRATA_RETURN_IF_ERROR(CudaToStatus(cudaIpcGetMemHandle(&handle, base), "cudaIpcGetMemHandle"));
    DeviceExport out;
    out.kind = DeviceExport::Kind::kCudaIpc;
    out.cuda_ipc_handle.assign(reinterpret_cast<const char*>(&handle), sizeof(handle));
    out.device_ordinal = ordinal_;
    out.offset = buffer.handle - reinterpret_cast<uint64_t>(base);
    out.bytes = buffer.size_bytes;
    return out;
  }

  absl::Status WaitEvent(EventId event) override {
    cudaEvent_t e;
    {
      absl::MutexLock lock(&mu_);
      auto it = events_.find(event.value);
      if (it == events_.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat("CUDA device: unknown or already waited event ", event.value));
      }
      e = it->second;
      events_.erase(it);
    }
    // Synchronizing without the lock: other threads keep queueing copies.
    absl::Status status = CudaToStatus(cudaEventSynchronize(e), "waiting for copies");
    cudaEventDestroy(e);
    return status;
  }

 private:
  absl::StatusOr<DeviceBuffer> AllocateOwnLocked(uint64_t size_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (size_bytes > capacity_bytes_ - own_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(info_.name, ": ", FormatBytes(size_bytes), " requested, ",
                                                       FormatBytes(capacity_bytes_ - own_bytes_), " of ",
                                                       FormatBytes(capacity_bytes_), " free"));
    }
    STRATA_RETURN_IF_ERROR(CudaToStatus(cudaSetDevice(ordinal_), "cudaSetDevice"));
    void* memory = nullptr;
    absl::Status status = CudaToStatus(cudaMalloc(&memory, size_bytes),
                                       absl::StrCat("allocating ", FormatBytes(size_bytes), " on cuda:", ordinal_));
    if (!status.ok()) return absl::ResourceExhaustedError(status.message());
    if (absl::Status zeroed = ZeroLocked(memory, size_bytes); !zeroed.ok()) {
      cudaFree(memory);
      return zeroed;
    }
    const uint64_t handle = reinterpret_cast<uint64_t>(memory);
    ranges_[handle] = SlotRange{0, size_bytes};
    own_bytes_ += size_bytes;
    return DeviceBuffer{handle, size_bytes};
  }

  // A buffer is handed out zeroed: the daemon shares a job's buffer whole
  // with that job's trainers, and neither cudaMalloc (memory another
  // allocation, of this process or another, freed) nor the arena (a range a
  // freed buffer held) clears what was there -- another job's shards. The
  // memset runs on the default stream, which the non-blocking copy streams
  // do not wait for, so it is finished before the buffer is returned.
  absl::Status ZeroLocked(void* memory, uint64_t size_bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    STRATA_RETURN_IF_ERROR(CudaToStatus(cudaSetDevice(ordinal_), "cudaSetDevice"));
    const std::string what = absl::StrCat("zeroing a new buffer of ", FormatBytes(size_bytes), " on cuda:", ordinal_);
    STRATA_RETURN_IF_ERROR(CudaToStatus(cudaMemsetAsync(memory, 0, size_bytes, /*stream=*/nullptr), what));
    return CudaToStatus(cudaStreamSynchronize(/*stream=*/nullptr), what);
  }

  absl::StatusOr<cudaStream_t> Stream(StreamId id) {
    absl::MutexLock lock(&mu_);
    if (id.value == 0 || id.value > streams_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("CUDA device: unknown stream ", id.value));
    }
    return streams_[id.value - 1];
  }

  absl::Status CheckRange(DeviceBuffer buffer, uint64_t offset_bytes, uint64_t size_bytes) {
    absl::MutexLock lock(&mu_);
    if (!ranges_.contains(buffer.handle)) {
      return absl::InvalidArgumentError("CUDA device: unknown buffer");
    }
    if (offset_bytes > buffer.size_bytes || size_bytes > buffer.size_bytes - offset_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA device: copy of ", size_bytes, " bytes at offset ", offset_bytes,
          " is outside a buffer of ", buffer.size_bytes, " bytes"));
    }
    return absl::OkStatus();
  }

  const int ordinal_;
  const DeviceInfo info_;
  std::byte* const arena_;  // null: a cudaMalloc per buffer
  const uint64_t capacity_bytes_;

  mutable absl::Mutex mu_;
  SlotAllocator allocator_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, SlotRange> ranges_ ABSL_GUARDED_BY(mu_);
  std::vector<cudaStream_t> streams_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, cudaEvent_t> events_ ABSL_GUARDED_BY(mu_);
  uint64_t next_event_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t own_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // per-buffer mode: allocated
};

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  // Any failure here means "no usable GPU on this machine" (no driver, no
  // device, a container without /dev/nvidia*), which callers treat alike.
  absl::Status status = CudaToStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (!status.ok()) return absl::FailedPreconditionError(status.message());
  return count;
}

absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(const CudaDeviceOptions& options) {
  STRATA_ASSIGN_OR_RETURN(int count, CudaDeviceCount());
  if (options.device_ordinal < 0 || options.device_ordinal >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", options.device_ordinal, " requested but ", count, " visible"));
  }
  if (options.arena_bytes % kSlotAlignment != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device: arena_bytes must be a multiple of ", kSlotAlignment));
  }
  if (options.arena_bytes == 0 && options.capacity_bytes == 0) {
    return absl::InvalidArgumentError("CUDA device: without an arena (arena_bytes 0), capacity_bytes must be positive");
  }
  STRATA_RETURN_IF_ERROR(CudaToStatus(cudaSetDevice(options.device_ordinal), "cudaSetDevice"));
  cudaDeviceProp prop;
  STRATA_RETURN_IF_ERROR(CudaToStatus(
      cudaGetDeviceProperties(&prop, options.device_ordinal), "cudaGetDeviceProperties"));
  if (options.arena_bytes == 0) {
    if (options.capacity_bytes > prop.totalGlobalMem) {
      return absl::ResourceExhaustedError(absl::StrCat("CUDA device: capacity ", FormatBytes(options.capacity_bytes),
                                                       " exceeds cuda:", options.device_ordinal, "'s ",
                                                       FormatBytes(prop.totalGlobalMem)));
    }
    DeviceInfo info{absl::StrCat(prop.name, " (cuda:", options.device_ordinal, ")"), options.capacity_bytes};
    return std::unique_ptr<Device>(
        new CudaDevice(options.device_ordinal, std::move(info), nullptr, 0, options.capacity_bytes));
  }
  void* arena = nullptr;
  STRATA_RETURN_IF_ERROR(CudaToStatus(
      cudaMalloc(&arena, options.arena_bytes),
      absl::StrCat("allocating a ", FormatBytes(options.arena_bytes), " device arena on cuda:",
                   options.device_ordinal)));
  DeviceInfo info{absl::StrCat(prop.name, " (cuda:", options.device_ordinal, ")"),
                  options.arena_bytes};
  return std::unique_ptr<Device>(
      new CudaDevice(options.device_ordinal, std::move(info), arena, options.arena_bytes, options.arena_bytes));
}

}  // namespace strata
