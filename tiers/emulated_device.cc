#include "tiers/emulated_device.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"

namespace strata {

absl::StatusOr<std::unique_ptr<EmulatedDevice>> EmulatedDevice::Create(
    const EmulatedDeviceOptions& options) {
  if (options.capacity_bytes == 0) {
    return absl::InvalidArgumentError("emulated device: capacity_bytes must be > 0");
  }
  if (options.bandwidth_bytes_per_second < 0) {
    return absl::InvalidArgumentError("emulated device: bandwidth must be >= 0");
  }
  const bool models_cost =
      options.bandwidth_bytes_per_second > 0 || options.latency > absl::ZeroDuration();
  if (models_cost && options.clock == nullptr) {
    return absl::InvalidArgumentError(
        "emulated device: a copy bandwidth or latency needs a clock to spend it on");
  }
  return std::unique_ptr<EmulatedDevice>(new EmulatedDevice(options));
}

absl::StatusOr<EmulatedDevice::Memory> EmulatedDevice::Memory::Make(uint64_t size_bytes, bool shared) {
  Memory m;
  m.size_ = size_bytes;
  if (!shared) {
    // Value-initialised so reads of never-written device memory are
    // deterministic (a real GPU gives garbage; tests must not depend on either).
    m.heap_ = std::make_unique<std::byte[]>(size_bytes);
    m.data_ = m.heap_.get();
    return m;
  }
  m.fd_ = memfd_create("strata-emulated-device", MFD_CLOEXEC);
  if (m.fd_ < 0) {
    return absl::InternalError(absl::StrCat("emulated device: memfd_create failed: ", strerror(errno)));
  }
  if (ftruncate(m.fd_, static_cast<off_t>(size_bytes)) != 0) {
    return absl::ResourceExhaustedError(absl::StrCat("emulated device: sizing a memfd of ", FormatBytes(size_bytes),
                                                     " failed: ", strerror(errno)));
  }
  void* base = mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd_, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("emulated device: mapping a memfd of ", FormatBytes(size_bytes),
                                                     " failed: ", strerror(errno)));
  }
  m.data_ = static_cast<std::byte*>(base);
  return m;
}

EmulatedDevice::Memory::Memory(Memory&& other) noexcept { *this = std::move(other); }

EmulatedDevice::Memory& EmulatedDevice::Memory::operator=(Memory&& other) noexcept {
  if (this == &other) return *this;
  Reset();
  heap_ = std::move(other.heap_);
  data_ = std::exchange(other.data_, nullptr);
  size_ = std::exchange(other.size_, 0);
  fd_ = std::exchange(other.fd_, -1);
  return *this;
}

EmulatedDevice::Memory::~Memory() { Reset(); }

void EmulatedDevice::Memory::Reset() {
  if (fd_ >= 0) {
    if (data_ != nullptr) munmap(data_, size_);
    close(fd_);
  }
  heap_.reset();
  data_ = nullptr;
  size_ = 0;
  fd_ = -1;
}

EmulatedDevice::EmulatedDevice(const EmulatedDeviceOptions& options)
    : options_(options),
      info_{"emulated", options.capacity_bytes},
      modelled_copy_time_(absl::ZeroDuration()) {}

uint64_t EmulatedDevice::allocated_bytes() const {
  absl::MutexLock lock(&mu_);
  return allocated_bytes_;
}

absl::StatusOr<DeviceBuffer> EmulatedDevice::Allocate(uint64_t size_bytes) {
  if (size_bytes == 0) return absl::InvalidArgumentError("emulated device: allocating 0 bytes");
  absl::MutexLock lock(&mu_);
  ++allocations_;
  if (allocations_ == options_.fail_allocation_number) {
    return absl::ResourceExhaustedError(
        absl::StrCat("emulated device: injected failure of allocation #", allocations_));
  }
  if (size_bytes > options_.capacity_bytes - allocated_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "emulated device: allocating ", FormatBytes(size_bytes), " with ",
        FormatBytes(options_.capacity_bytes - allocated_bytes_), " of ",
        FormatBytes(options_.capacity_bytes), " free"));
  }
  absl::StatusOr<Memory> memory = Memory::Make(size_bytes, options_.shared_memory);
  if (!memory.ok()) return memory.status();
  const uint64_t handle = next_handle_++;
  buffers_.emplace(handle, std::move(*memory));
  allocated_bytes_ += size_bytes;
  return DeviceBuffer{handle, size_bytes};
}

void EmulatedDevice::Free(DeviceBuffer buffer) {
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(buffer.handle);
  if (it == buffers_.end()) return;
  allocated_bytes_ -= it->second.size();
  buffers_.erase(it);
}

absl::StatusOr<DeviceExport> EmulatedDevice::Export(DeviceBuffer buffer) const {
  if (!options_.shared_memory) {
    return absl::UnimplementedError(
        "emulated device: its memory is heap memory; create it with shared_memory to share a buffer");
  }
  absl::MutexLock lock(&mu_);
  auto it = buffers_.find(buffer.handle);
  if (it == buffers_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("emulated device: unknown buffer ", buffer.handle));
  }
  DeviceExport out;
  out.kind = DeviceExport::Kind::kMemfd;
  out.memfd = it->second.fd();
  out.offset = 0;
  out.bytes = it->second.size();
  return out;
}

absl::StatusOr<StreamId> EmulatedDevice::CreateStream() {
  absl::MutexLock lock(&mu_);
  return StreamId{++streams_};
}

absl::StatusOr<std::byte*> EmulatedDevice::Resolve(DeviceBuffer buffer, uint64_t offset_bytes,
                                                   uint64_t size_bytes, StreamId stream) {
  if (stream.value == 0 || stream.value > streams_) {
    return absl::InvalidArgumentError(
        absl::StrCat("emulated device: unknown stream ", stream.value));
  }
  auto it = buffers_.find(buffer.handle);
  if (it == buffers_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("emulated device: unknown buffer ", buffer.handle));
  }
  const uint64_t size = it->second.size();
  if (offset_bytes > size || size_bytes > size - offset_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "emulated device: copy of ", size_bytes, " bytes at offset ", offset_bytes,
        " is outside buffer ", buffer.handle, " of ", size, " bytes"));
  }
  return it->second.data() + offset_bytes;
}

absl::Status EmulatedDevice::Copy(bool to_device, void* host, DeviceBuffer buffer,
                                  uint64_t offset_bytes, uint64_t size_bytes, StreamId stream) {
  absl::Duration cost = options_.latency;
  if (options_.bandwidth_bytes_per_second > 0) {
    cost += absl::Seconds(static_cast<double>(size_bytes) / options_.bandwidth_bytes_per_second);
  }
  {
    absl::MutexLock lock(&mu_);
    ++copies_;
    if (copies_ == options_.fail_copy_number) {
      return absl::UnavailableError(
          absl::StrCat("emulated device: injected failure of copy #", copies_));
    }
    auto device = Resolve(buffer, offset_bytes, size_bytes, stream);
    if (!device.ok()) return device.status();
    // The copy runs under the lock so Free cannot race it; the modelled time
    // is spent outside it so concurrent copies overlap as on separate streams.
    if (to_device) {
      std::memcpy(*device, host, size_bytes);
    } else {
      std::memcpy(host, *device, size_bytes);
    }
    modelled_copy_time_ += cost;
  }
  if (cost > absl::ZeroDuration()) options_.clock->SleepFor(cost);
  return absl::OkStatus();
}

absl::Status EmulatedDevice::CopyToDevice(DeviceBuffer dst, uint64_t dst_offset_bytes,
                                          const void* src, uint64_t size_bytes, StreamId stream) {
  return Copy(true, const_cast<void*>(src), dst, dst_offset_bytes, size_bytes, stream);
}

absl::Status EmulatedDevice::CopyToHost(void* dst, DeviceBuffer src, uint64_t src_offset_bytes,
                                        uint64_t size_bytes, StreamId stream) {
  return Copy(false, dst, src, src_offset_bytes, size_bytes, stream);
}

absl::StatusOr<EventId> EmulatedDevice::RecordEvent(StreamId stream) {
  absl::MutexLock lock(&mu_);
  if (stream.value == 0 || stream.value > streams_) {
    return absl::InvalidArgumentError(
        absl::StrCat("emulated device: unknown stream ", stream.value));
  }
  // Copies finish when queued, so every event is complete when recorded.
  const uint64_t id = next_event_++;
  events_[id] = absl::OkStatus();
  return EventId{id};
}

absl::Status EmulatedDevice::WaitEvent(EventId event) {
  absl::MutexLock lock(&mu_);
  auto it = events_.find(event.value);
  if (it == events_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("emulated device: unknown or already waited event ", event.value));
  }
  absl::Status status = std::move(it->second);
  events_.erase(it);
  return status;
}

absl::Duration EmulatedDevice::modelled_copy_time() const {
  absl::MutexLock lock(&mu_);
  return modelled_copy_time_;
}

}  // namespace strata
