// Device: the seam between the device tier and an accelerator's memory.
//
// A Device owns device memory and moves bytes between it and host memory on
// in-order streams, with events to learn when queued copies have finished.
// Two implementations: EmulatedDevice (host memory with a configurable
// capacity and an optional bandwidth/latency model; every test and benchmark
// runs on it) and CudaDevice (tiers/cuda/, built only where the CUDA toolkit
// is found; see cuda_device_factory.h). Nothing outside tiers/cuda/ sees a
// CUDA type: buffers, streams and events are plain handles here.
//
// Thread-safe: every method may be called from any thread. Copies queued on
// one stream run in order; copies on different streams may overlap.
#ifndef STRATA_TIERS_DEVICE_H_
#define STRATA_TIERS_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace strata {

// A block of device memory. `handle` is the device's own name for it (for
// CUDA, the device pointer); the caller never dereferences it.
struct DeviceBuffer {
  uint64_t handle = 0;
  uint64_t size_bytes = 0;
  bool valid() const { return handle != 0; }
};

// An in-order queue of copies. Stream 0 is never returned by CreateStream.
struct StreamId {
  uint32_t value = 0;
  friend bool operator==(StreamId, StreamId) = default;
};

// Marks a point in a stream; complete once every copy queued before it is.
struct EventId {
  uint64_t value = 0;
  friend bool operator==(EventId, EventId) = default;
};

// How another process reaches a device buffer (Device::Export): the daemon
// shares its device arena once with each trainer session.
struct DeviceExport {
  enum class Kind : uint8_t { kMemfd, kCudaIpc };
  Kind kind = Kind::kMemfd;
  // kMemfd: a memfd holding the allocation's bytes, owned by the device
  // (valid while the buffer lives); the buffer starts at `offset` in it.
  int memfd = -1;
  // kCudaIpc: cudaIpcMemHandle_t of the allocation containing the buffer
  // (cudaIpcOpenMemHandle in the trainer), the buffer at `offset` in it.
  std::string cuda_ipc_handle;
  int device_ordinal = -1;
  uint64_t offset = 0;
  uint64_t bytes = 0;  // the buffer's size
};

struct DeviceInfo {
  std::string name;               // "emulated", "NVIDIA H200 (cuda:0)"
  uint64_t total_bytes = 0;       // memory the device can hand out
};

class Device {
 public:
  virtual ~Device() = default;

  virtual const DeviceInfo& info() const = 0;
  // Bytes currently allocated by Allocate and not yet freed.
  virtual uint64_t allocated_bytes() const = 0;

  // Allocates `size_bytes` (> 0) of device memory. ResourceExhausted when the
  // device has no room (the message gives requested and free bytes).
  virtual absl::StatusOr<DeviceBuffer> Allocate(uint64_t size_bytes) = 0;
  // Returns a buffer from Allocate. REQUIRES: no copy on it is still queued.
  virtual void Free(DeviceBuffer buffer) = 0;

  // Streams live until the device is destroyed.
  virtual absl::StatusOr<StreamId> CreateStream() = 0;

  // Queues a copy of `size_bytes` from host `src` into `dst` at `dst_offset`.
  // `src` must stay valid and unchanged until an event recorded after the
  // copy completes. InvalidArgument when the range is outside the buffer.
  virtual absl::Status CopyToDevice(DeviceBuffer dst, uint64_t dst_offset_bytes,
                                    const void* src, uint64_t size_bytes,
                                    StreamId stream) = 0;
  // Queues a copy from `src` at `src_offset` into host `dst`.
  virtual absl::Status CopyToHost(void* dst, DeviceBuffer src, uint64_t src_offset_bytes,
                                  uint64_t size_bytes, StreamId stream) = 0;

  // Records an event after everything queued on `stream` so far.
  virtual absl::StatusOr<EventId> RecordEvent(StreamId stream) = 0;
  // Blocks until `event` completes, then forgets it (each event is waited for
  // once). Returns the first error of the copies it covers.
  virtual absl::Status WaitEvent(EventId event) = 0;

  // A handle another process can map `buffer` by (see DeviceExport).
  // Unimplemented for a device that cannot share its memory (an emulated
  // device on heap memory).
  virtual absl::StatusOr<DeviceExport> Export(DeviceBuffer /*buffer*/) const {
    return absl::UnimplementedError(absl::StrCat(info().name, ": device memory cannot be shared"));
  }
};

}  // namespace strata

#endif  // STRATA_TIERS_DEVICE_H_
