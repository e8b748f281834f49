// PieceEngine: the part of the IoEngine contract that does not depend on the
// kernel interface, shared by UringEngine, AioEngine and PsyncEngine.
//
// It owns the file table, validates requests (O_DIRECT alignment), splits
// requests into block-size pieces, keeps at most queue_depth pieces in the
// kernel, resubmits short transfers for the remainder, retries -EAGAIN and
// -EINTR, turns errors into Statuses that name file, offset and length,
// assembles per-request completions and implements Shutdown. A backend only
// moves pieces into and out of the kernel (KernelSubmit / KernelWait), so the
// three engines cannot drift apart in what they promise.
//
// Internal to swap/: not part of the public API.
#ifndef STRATA_SWAP_PIECE_ENGINE_H_
#define STRATA_SWAP_PIECE_ENGINE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "swap/io_engine.h"

namespace strata::internal {

// One kernel-level operation: a piece of a request (or the remainder of a
// piece after a short transfer).
struct KernelPiece {
  IoOp op = IoOp::kRead;
  uint32_t file_index = 0;  // IoFileId::value, also the fixed-file slot
  int fd = -1;
  uint64_t offset_bytes = 0;
  std::byte* buffer = nullptr;
  uint64_t length_bytes = 0;
};

class PieceEngine : public IoEngine {
 public:
  ~PieceEngine() override;

  const IoEngineInfo& info() const final { return info_; }
  absl::StatusOr<IoFileId> RegisterFile(int fd, absl::string_view path) final;
  absl::Status UnregisterFile(IoFileId file) final;
  absl::Status RegisterBuffers(absl::Span<const BufferRegion> regions) final;
  absl::StatusOr<uint32_t> RequiredAlignment(IoFileId file) const final;
  absl::StatusOr<size_t> Submit(absl::Span<const IoRequest> requests) final;
  absl::Status Reap(size_t min_completions, absl::Duration timeout,
                    std::vector<IoCompletion>* out) final;
  size_t outstanding() const final { return outstanding_requests_; }
  void Shutdown() final;

 protected:
  struct KernelResult {
    uint32_t slot = 0;
    int64_t result = 0;  // bytes or -errno
  };

  // REQUIRES: options validated.
  PieceEngine(const IoEngineOptions& options, std::string name);

  // Derived destructors must call Shutdown() first: the base destructor can
  // no longer reach the backend to wait for pieces in the kernel.

  // Hands the pieces in `slots` to the kernel; returns how many from the
  // front it took (the rest are offered again later). An error means the
  // backend is broken.
  virtual absl::StatusOr<size_t> KernelSubmit(absl::Span<const uint32_t> slots) = 0;
  // Waits up to `timeout` for at least one result, then appends every result
  // available without waiting. OK with none appended on timeout.
  virtual absl::Status KernelWait(absl::Duration timeout,
                                  std::vector<KernelResult>* results) = 0;
  // Best effort: asks the kernel to cancel pieces in flight; their results
  // (-ECANCELED or the real outcome) still arrive through KernelWait.
  virtual void KernelCancelAll() {}
  // The file table changed (io_uring re-registers files). Called with no
  // piece in flight.
  virtual void OnFilesChanged() {}
  // The buffer regions changed (io_uring re-registers buffers). Called with
  // no piece in flight.
  virtual void OnBuffersChanged() {}

  const KernelPiece& piece(uint32_t slot) const { return slots_[slot].piece; }
  // Index of the registered region that holds [p, p + n), or -1.
  int FindBufferRegion(const void* p, uint64_t n) const;
  const std::vector<BufferRegion>& buffer_regions() const { return regions_; }
  // fds indexed by IoFileId::value; -1 where unregistered.
  std::vector<int> FileDescriptors() const;
  uint32_t queue_depth() const { return options_.queue_depth; }
  // Adds a note to info().notes unless the same text is already there.
  void AddNote(std::string note);

  IoEngineInfo info_;

 private:
  struct FileEntry {
    int fd = -1;
    std::string path;
    bool direct = false;
    uint32_t alignment = 1;
  };
  struct RequestState {
    bool in_use = false;
    IoRequest request;
    uint64_t next_issue_offset = 0;  // bytes of the request already cut into pieces
    uint32_t pieces_live = 0;        // in the kernel or waiting for a retry
    uint64_t bytes_done = 0;
    bool cancelled = false;
    absl::Status status;
  };
  struct Slot {
    bool in_use = false;
    uint32_t request = 0;
    KernelPiece piece;
    uint32_t retries = 0;  // consecutive attempts without progress
  };
  struct RetryPiece {
    uint32_t request = 0;
    KernelPiece piece;
    uint32_t retries = 0;
  };

  // Moves retries, then new pieces, into free slots and the kernel.
  absl::Status Pump();
  // Applies one kernel result.
  void HandleResult(const KernelResult& r);
  void FinishPieceWithError(uint32_t request, absl::Status status);
  void MaybeComplete(uint32_t request);
  std::string DescribePiece(const RequestState& req, const KernelPiece& piece) const;
  size_t in_kernel() const { return in_kernel_; }

  IoEngineOptions options_;
  std::vector<FileEntry> files_;
  std::vector<BufferRegion> regions_;  // sorted by base
  std::vector<RequestState> requests_;
  std::vector<uint32_t> free_requests_;
  std::deque<uint32_t> issue_queue_;  // requests with pieces still to cut
  std::deque<RetryPiece> retry_queue_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  std::vector<uint32_t> submit_batch_;  // scratch
  std::vector<KernelResult> results_;   // scratch
  std::deque<IoCompletion> ready_;
  size_t in_kernel_ = 0;
  size_t outstanding_requests_ = 0;
  bool shut_down_ = false;
};

}  // namespace strata::internal

#endif  // STRATA_SWAP_PIECE_ENGINE_H_
