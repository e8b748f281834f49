// IoEngine: asynchronous positioned reads and writes on registered files.
//
// An engine takes batches of IoRequests, keeps up to `queue_depth` pieces in
// the kernel at once, and hands back one IoCompletion per request. Three
// implementations share this contract and one conformance suite
// (swap/io_engine_conformance_test.cc):
//   UringEngine  io_uring (liburing), one long-lived ring per engine;
//   AioEngine    Linux native AIO (libaio);
//   PsyncEngine  pread/pwrite on a small thread pool; always available.
// The composition root (daemon/) picks one with OpenIoEngine() below; the
// libraries that use an engine never choose it themselves.
//
// The contract every engine keeps:
//  * A completion is either OK with exactly `length_bytes` transferred, or an
//    error. Short transfers are resubmitted for the remainder and -EAGAIN /
//    -EINTR are retried inside the engine, so a short read never passes as
//    success.
//  * Requests longer than `block_size_bytes` are split into block-size pieces
//    that are in flight together (bounded by queue_depth). A request completes
//    once all its pieces have; if any piece failed, the completion carries the
//    first error and is delivered only after no piece of it is still in the
//    kernel, so the buffer may be reused as soon as the completion is reaped.
//  * Errors name the file, offset and length:
//      "writing /nvme/strata-0.data at offset 1048576, 8388608 bytes: No space
//       left on device (ENOSPC)"
//    ENOSPC -> ResourceExhausted, EIO -> DataLoss, other errno as
//    core/errno_status.h maps them.
//  * On a file opened with O_DIRECT, buffer address, offset and length must be
//    multiples of the file's direct-I/O alignment (statx STATX_DIOALIGN, else
//    the device's logical block size; see swap/direct_io.h). Violations are
//    rejected by Submit() with InvalidArgument stating the rule; nothing of the
//    batch is queued.
//  * Completions come back in any order; match them by `user_data`.
//
// Thread-compatible: one thread at a time submits and reaps on an engine
// instance (use one engine per I/O thread). Engines are not copyable.
#ifndef STRATA_SWAP_IO_ENGINE_H_
#define STRATA_SWAP_IO_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace strata {

enum class IoOp : uint8_t { kRead = 0, kWrite = 1 };
absl::string_view IoOpName(IoOp op);  // "read", "write"

// Names a file registered with one engine. Only meaningful to that engine.
struct IoFileId {
  uint32_t value = 0;
  friend bool operator==(IoFileId, IoFileId) = default;
};

struct IoRequest {
  IoOp op = IoOp::kRead;
  IoFileId file;
  uint64_t offset_bytes = 0;
  // Borrowed; must stay valid (and, for writes, unchanged) until the
  // request's completion has been reaped.
  void* buffer = nullptr;
  uint64_t length_bytes = 0;
  // Echoed in the completion. The engine does not interpret it.
  uint64_t user_data = 0;
  // Whom the request is for (the extent store puts the shard's owner, its
  // job, here). Engines ignore it; a decorator may use it (the test-only
  // swap/testing/fault_injection_io_engine.h scopes faults to one job by it).
  uint64_t tag = 0;
};

struct IoCompletion {
  uint64_t user_data = 0;
  // OK: exactly the request's length was transferred. Cancelled: the engine
  // was shut down before (all of) the request ran; the buffer is free again.
  absl::Status status;
  // Bytes known to have been transferred (== length on OK). On error it is the
  // count of leading bytes completed, for diagnostics only.
  uint64_t transferred_bytes = 0;
};

// What an engine ended up doing, for the daemon to log once at startup. The
// engine never logs by itself.
struct IoEngineInfo {
  std::string name;  // "io_uring", "libaio", "psync"
  uint32_t queue_depth = 0;
  uint64_t block_size_bytes = 0;
  bool registered_buffers = false;  // io_uring fixed buffers in use
  bool registered_files = false;    // io_uring fixed files in use
  bool sqpoll = false;
  // Why a requested feature was not used ("registered buffers off: ..."),
  // one entry per reason, each said once.
  std::vector<std::string> notes;
};

// Test seam: sees each kernel-level result before the engine interprets it
// and may replace it, exactly as if the kernel had returned the new value.
// `result` is bytes transferred (>= 0) or -errno. Used by
// swap/testing/fault_injector.h to inject short transfers, -EAGAIN, -EINTR,
// -EIO and -ENOSPC beneath the engine's retry logic. Must be thread-safe
// (PsyncEngine calls it from its worker threads). Null in production.
class IoResultHook {
 public:
  virtual ~IoResultHook() = default;
  // `op`, `offset_bytes` and `length_bytes` describe the piece that was just
  // executed. Returns the result the engine should act on.
  virtual int64_t AdjustResult(IoOp op, uint64_t offset_bytes,
                               uint64_t length_bytes, int64_t result) = 0;
};

struct IoEngineOptions {
  // Pieces kept in the kernel at once. DeepSpeed's aio.queue_depth.
  uint32_t queue_depth = 32;
  // Requests are split into pieces of at most this size. DeepSpeed's
  // aio.block_size. A multiple of 4096.
  uint64_t block_size_bytes = 1 << 20;
  // io_uring only: use fixed buffers for requests inside regions passed to
  // RegisterBuffers(), raising RLIMIT_MEMLOCK when the process may. When the
  // kernel or the limit refuses, I/O continues unregistered and info().notes
  // says why.
  bool register_buffers = true;
  // io_uring only: register files (IOSQE_FIXED_FILE).
  bool register_files = true;
  // io_uring only: a kernel thread polls the submission queue.
  bool sqpoll = false;
  absl::Duration sqpoll_idle = absl::Milliseconds(100);
  // Requests accepted but not yet finished, across Submit calls. Submit
  // accepts at most this many minus those outstanding.
  uint32_t max_outstanding_requests = 65536;
  // PsyncEngine only: worker threads; 0 means min(queue_depth, 32).
  uint32_t psync_threads = 0;
  // Borrowed, may be null; must outlive the engine. See IoResultHook.
  IoResultHook* result_hook = nullptr;
};

// REQUIRES for all options: queue_depth in [1, 4096]; block_size_bytes a
// multiple of 4096 in [4 KiB, 1 GiB]. Otherwise InvalidArgument.
absl::Status ValidateIoEngineOptions(const IoEngineOptions& options);

class IoEngine {
 public:
  virtual ~IoEngine() = default;
  IoEngine() = default;
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  virtual const IoEngineInfo& info() const = 0;

  // Registers an open file. The engine borrows `fd` (it must stay open until
  // UnregisterFile or the engine's destruction) and reads its O_DIRECT flag
  // and direct-I/O alignment once, here. `path` is used in error messages.
  // REQUIRES: no request in flight (FailedPrecondition otherwise).
  virtual absl::StatusOr<IoFileId> RegisterFile(int fd,
                                                absl::string_view path) = 0;
  // REQUIRES: no request on `file` outstanding.
  virtual absl::Status UnregisterFile(IoFileId file) = 0;

  // Declares memory regions that I/O buffers will come from. io_uring
  // registers them as fixed buffers (when options allow and memlock permits);
  // other engines only record them. Replaces any previous set. Each region
  // must be at most 1 GiB (the kernel's limit for one fixed buffer).
  // REQUIRES: no request in flight (FailedPrecondition otherwise).
  // Returns OK also when registration fell back to unregistered I/O
  // (info().notes then says why).
  struct BufferRegion {
    void* base = nullptr;
    uint64_t length_bytes = 0;
  };
  virtual absl::Status RegisterBuffers(absl::Span<const BufferRegion> regions) = 0;

  // Alignment that O_DIRECT imposes on `file` (1 for buffered files).
  // Buffer address, offset and length must all be multiples of it.
  virtual absl::StatusOr<uint32_t> RequiredAlignment(IoFileId file) const = 0;

  // Queues `requests`. Returns how many were accepted, from the front; the
  // caller resubmits the rest after reaping (only fewer than all when
  // max_outstanding_requests would be exceeded). Validates the whole batch
  // first: an unknown file, a null buffer, a zero length or a misaligned
  // O_DIRECT request is InvalidArgument and nothing is queued. After
  // Shutdown(): FailedPrecondition.
  virtual absl::StatusOr<size_t> Submit(absl::Span<const IoRequest> requests) = 0;

  // Moves I/O forward and appends completed requests to `*out`: waits until
  // at least `min_completions` are available or `timeout` passes (then fewer,
  // possibly none, and still OK). min_completions is capped at
  // outstanding(). A non-OK return means the engine itself failed (e.g. the
  // ring broke), not that a request failed; request errors are completions.
  virtual absl::Status Reap(size_t min_completions, absl::Duration timeout,
                            std::vector<IoCompletion>* out) = 0;

  // Requests accepted and not yet reaped.
  virtual size_t outstanding() const = 0;

  // Stops accepting requests. Pieces not yet handed to the kernel are
  // cancelled; pieces in the kernel are cancelled where the kernel allows or
  // waited for. Afterwards every outstanding request has a completion waiting
  // for Reap (OK if it finished, Cancelled otherwise) and no buffer is in use
  // by the kernel. Idempotent. The destructor calls it.
  virtual void Shutdown() = 0;
};

// Each factory returns Unimplemented (with the reason) when the kernel or
// library lacks support here, so the composition root can fall back.
absl::StatusOr<std::unique_ptr<IoEngine>> NewUringEngine(const IoEngineOptions& options);
absl::StatusOr<std::unique_ptr<IoEngine>> NewAioEngine(const IoEngineOptions& options);
absl::StatusOr<std::unique_ptr<IoEngine>> NewPsyncEngine(const IoEngineOptions& options);

enum class IoEngineKind : uint8_t { kUring = 0, kAio = 1, kPsync = 2 };
absl::string_view IoEngineKindName(IoEngineKind kind);  // "io_uring", "libaio", "psync"
// Accepts "io_uring" (or "uring"), "libaio" (or "aio"), "psync".
absl::StatusOr<IoEngineKind> ParseIoEngineKind(absl::string_view text);

absl::StatusOr<std::unique_ptr<IoEngine>> NewIoEngine(IoEngineKind kind,
                                                      const IoEngineOptions& options);

// For the composition root: builds `forced` if it has a value (failing if it cannot),
// else the first of io_uring -> libaio -> psync that works here. Each engine
// that was skipped adds "io_uring unavailable: <reason>" to `*fallback_notes`
// so the daemon can log the choice once.
absl::StatusOr<std::unique_ptr<IoEngine>> OpenIoEngine(
    const IoEngineOptions& options, std::optional<IoEngineKind> forced,
    std::vector<std::string>* fallback_notes);

}  // namespace strata

#endif  // STRATA_SWAP_IO_ENGINE_H_
