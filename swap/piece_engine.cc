#include "swap/piece_engine.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/errno_status.h"
#include "core/status_macros.h"
#include "swap/direct_io.h"

namespace strata::internal {
namespace {

// -EAGAIN/-EINTR are transient; a device that keeps returning them for this
// many consecutive attempts is reported as Unavailable rather than spun on.
constexpr uint32_t kMaxTransientRetries = 1000;
// A short transfer that makes no (aligned) progress this many times in a row
// is an error: typically a read past the end of the file.
constexpr uint32_t kMaxNoProgressRetries = 16;

}  // namespace

PieceEngine::PieceEngine(const IoEngineOptions& options, std::string name)
    : options_(options) {
  info_.name = std::move(name);
  info_.queue_depth = options.queue_depth;
  info_.block_size_bytes = options.block_size_bytes;
  slots_.resize(options.queue_depth);
  free_slots_.reserve(options.queue_depth);
  for (uint32_t i = options.queue_depth; i > 0; --i) free_slots_.push_back(i - 1);
}

PieceEngine::~PieceEngine() {
  // Derived classes shut down before their backend goes away; by now no piece
  // may be in the kernel.
  STRATA_CHECK(in_kernel_ == 0);
}

void PieceEngine::AddNote(std::string note) {
  if (std::find(info_.notes.begin(), info_.notes.end(), note) == info_.notes.end()) {
    info_.notes.push_back(std::move(note));
  }
}

std::vector<int> PieceEngine::FileDescriptors() const {
  std::vector<int> fds;
  fds.reserve(files_.size());
  for (const FileEntry& f : files_) fds.push_back(f.fd);
  return fds;
}

int PieceEngine::FindBufferRegion(const void* p, uint64_t n) const {
  const auto* addr = static_cast<const std::byte*>(p);
  // Last region whose base is <= p.
  auto it = std::upper_bound(regions_.begin(), regions_.end(), addr,
                             [](const std::byte* a, const BufferRegion& r) {
                               return a < static_cast<const std::byte*>(r.base);
                             });
  if (it == regions_.begin()) return -1;
  --it;
  const auto* base = static_cast<const std::byte*>(it->base);
  if (addr + n > base + it->length_bytes) return -1;
  return static_cast<int>(it - regions_.begin());
}

absl::StatusOr<IoFileId> PieceEngine::RegisterFile(int fd, absl::string_view path) {
  if (shut_down_) return absl::FailedPreconditionError("RegisterFile after Shutdown");
  if (outstanding_requests_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "registering ", path, ": ", outstanding_requests_,
        " requests are outstanding; register files before submitting I/O"));
  }
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat("registering ", path, ": fd ", fd, " is not open"));
  FileEntry entry;
  entry.fd = fd;
  entry.path = std::string(path);
  STRATA_ASSIGN_OR_RETURN(entry.direct, IsDirectIo(fd, path));
  if (entry.direct) {
    STRATA_ASSIGN_OR_RETURN(DirectIoAlignment a, ProbeDirectIoAlignment(fd, path));
    entry.alignment = a.required();
  }
  uint32_t index = 0;
  while (index < files_.size() && files_[index].fd >= 0) ++index;
  if (index == files_.size()) files_.emplace_back();
  files_[index] = std::move(entry);
  OnFilesChanged();
  return IoFileId{index};
}

absl::Status PieceEngine::UnregisterFile(IoFileId file) {
  if (file.value >= files_.size() || files_[file.value].fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("UnregisterFile: file id ", file.value, " is not registered"));
  }
  if (outstanding_requests_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "unregistering ", files_[file.value].path, ": ", outstanding_requests_,
        " requests are outstanding; reap them first"));
  }
  files_[file.value] = FileEntry{};
  OnFilesChanged();
  return absl::OkStatus();
}

absl::Status PieceEngine::RegisterBuffers(absl::Span<const BufferRegion> regions) {
  if (shut_down_) return absl::FailedPreconditionError("RegisterBuffers after Shutdown");
  if (outstanding_requests_ > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "RegisterBuffers: ", outstanding_requests_,
        " requests are outstanding; register buffers before submitting I/O"));
  }
  std::vector<BufferRegion> sorted(regions.begin(), regions.end());
  for (const BufferRegion& r : sorted) {
    if (r.base == nullptr || r.length_bytes == 0) {
      return absl::InvalidArgumentError("RegisterBuffers: a region is empty or has a null base");
    }
    if (r.length_bytes > (uint64_t{1} << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RegisterBuffers: a region of ", r.length_bytes,
          " bytes exceeds the kernel's 1 GiB limit per fixed buffer; split it"));
    }
  }
  std::sort(sorted.begin(), sorted.end(), [](const BufferRegion& a, const BufferRegion& b) {
    return a.base < b.base;
  });
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (static_cast<std::byte*>(sorted[i - 1].base) + sorted[i - 1].length_bytes >
        static_cast<std::byte*>(sorted[i].base)) {
      return absl::InvalidArgumentError("RegisterBuffers: regions overlap");
    }
  }
  regions_ = std::move(sorted);
  OnBuffersChanged();
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> PieceEngine::RequiredAlignment(IoFileId file) const {
  if (file.value >= files_.size() || files_[file.value].fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("file id ", file.value, " is not registered"));
  }
  return files_[file.value].alignment;
}

absl::StatusOr<size_t> PieceEngine::Submit(absl::Span<const IoRequest> requests) {
  if (shut_down_) {
    return absl::FailedPreconditionError(
        absl::StrCat(info_.name, " engine is shut down; no new I/O is accepted"));
  }
  // Validate the whole batch before queueing any of it.
  for (size_t i = 0; i < requests.size(); ++i) {
    const IoRequest& r = requests[i];
    if (r.file.value >= files_.size() || files_[r.file.value].fd < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", i, " of the batch names file id ", r.file.value,
          ", which is not registered with this engine; call RegisterFile first"));
    }
    const FileEntry& f = files_[r.file.value];
    if (r.op != IoOp::kRead && r.op != IoOp::kWrite) {
      return absl::InvalidArgumentError(absl::StrCat("request ", i, " on ", f.path, " has an unknown op"));
    }
    if (r.buffer == nullptr || r.length_bytes == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", i, " (", IoOpName(r.op), " ", f.path, " at offset ", r.offset_bytes,
          ") has a null buffer or zero length"));
    }
    if (f.direct) {
      STRATA_RETURN_IF_ERROR(CheckDirectIoAlignment(f.path, f.alignment, r.buffer,
                                                    r.offset_bytes, r.length_bytes));
    }
  }
  size_t capacity = options_.max_outstanding_requests > outstanding_requests_
                        ? options_.max_outstanding_requests - outstanding_requests_
                        : 0;
  size_t n = std::min(capacity, requests.size());
  for (size_t i = 0; i < n; ++i) {
    uint32_t id;
    if (!free_requests_.empty()) {
      id = free_requests_.back();
      free_requests_.pop_back();
    } else {
      id = static_cast<uint32_t>(requests_.size());
      requests_.emplace_back();
    }
    RequestState& s = requests_[id];
    s = RequestState{};
    s.in_use = true;
    s.request = requests[i];
    issue_queue_.push_back(id);
    ++outstanding_requests_;
  }
  STRATA_RETURN_IF_ERROR(Pump());
  return n;
}

absl::Status PieceEngine::Pump() {
  if (shut_down_) return absl::OkStatus();
  submit_batch_.clear();
  while (!free_slots_.empty()) {
    uint32_t request;
    KernelPiece p;
    uint32_t retries = 0;
    if (!retry_queue_.empty()) {
      RetryPiece r = retry_queue_.front();
      retry_queue_.pop_front();
      if (!requests_[r.request].status.ok()) {
        // The request already failed: its remaining pieces are not worth doing.
        --requests_[r.request].pieces_live;
        MaybeComplete(r.request);
        continue;
      }
      request = r.request;
      p = r.piece;
      retries = r.retries;
    } else if (!issue_queue_.empty()) {
      request = issue_queue_.front();
      RequestState& s = requests_[request];
      if (!s.status.ok()) {
        issue_queue_.pop_front();
        MaybeComplete(request);
        continue;
      }
      const FileEntry& f = files_[s.request.file.value];
      uint64_t len = std::min<uint64_t>(options_.block_size_bytes,
                                        s.request.length_bytes - s.next_issue_offset);
      p.op = s.request.op;
      p.file_index = s.request.file.value;
      p.fd = f.fd;
      p.offset_bytes = s.request.offset_bytes + s.next_issue_offset;
      p.buffer = static_cast<std::byte*>(s.request.buffer) + s.next_issue_offset;
      p.length_bytes = len;
      s.next_issue_offset += len;
      ++s.pieces_live;
      if (s.next_issue_offset == s.request.length_bytes) issue_queue_.pop_front();
    } else {
      break;
    }
    uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = Slot{true, request, p, retries};
    submit_batch_.push_back(slot);
  }
  if (submit_batch_.empty()) return absl::OkStatus();
  absl::StatusOr<size_t> accepted = KernelSubmit(submit_batch_);
  size_t n = accepted.ok() ? *accepted : 0;
  in_kernel_ += n;
  // Pieces the kernel did not take go back to the front of the retry queue,
  // in order, so they are offered first next time.
  for (size_t i = submit_batch_.size(); i > n; --i) {
    uint32_t slot = submit_batch_[i - 1];
    Slot& s = slots_[slot];
    retry_queue_.push_front(RetryPiece{s.request, s.piece, s.retries});
    s.in_use = false;
    free_slots_.push_back(slot);
  }
  return accepted.status();
}

std::string PieceEngine::DescribePiece(const RequestState& req, const KernelPiece& p) const {
  std::string s = absl::StrCat(p.op == IoOp::kRead ? "reading " : "writing ",
                               files_[p.file_index].path, " at offset ", p.offset_bytes, ", ",
                               p.length_bytes, " bytes");
  if (p.offset_bytes != req.request.offset_bytes || p.length_bytes != req.request.length_bytes) {
    absl::StrAppend(&s, " (part of a ", req.request.length_bytes, "-byte request at offset ",
                    req.request.offset_bytes, ")");
  }
  return s;
}

void PieceEngine::FinishPieceWithError(uint32_t request, absl::Status status) {
  RequestState& s = requests_[request];
  if (s.status.ok()) s.status = std::move(status);
  --s.pieces_live;
  MaybeComplete(request);
}

void PieceEngine::MaybeComplete(uint32_t request) {
  RequestState& s = requests_[request];
  bool fully_issued = s.next_issue_offset == s.request.length_bytes;
  if (s.pieces_live > 0) return;
  if (!fully_issued && s.status.ok() && !s.cancelled) return;
  if (!fully_issued) {
    // Stop cutting pieces from a request that has failed or was cancelled.
    auto it = std::find(issue_queue_.begin(), issue_queue_.end(), request);
    if (it != issue_queue_.end()) issue_queue_.erase(it);
  }
  IoCompletion c;
  c.user_data = s.request.user_data;
  c.transferred_bytes = s.bytes_done;
  if (!s.status.ok()) {
    c.status = std::move(s.status);
  } else if (s.cancelled) {
    c.status = absl::CancelledError(absl::StrCat(
        IoOpName(s.request.op), " of ", files_[s.request.file.value].path, " at offset ",
        s.request.offset_bytes, ", ", s.request.length_bytes,
        " bytes: cancelled by engine shutdown after ", s.bytes_done, " bytes"));
  }
  ready_.push_back(std::move(c));
  s = RequestState{};
  free_requests_.push_back(request);
}

void PieceEngine::HandleResult(const KernelResult& r) {
  Slot& slot = slots_[r.slot];
  STRATA_CHECK(slot.in_use);
  uint32_t request = slot.request;
  KernelPiece p = slot.piece;
  uint32_t retries = slot.retries;
  slot.in_use = false;
  free_slots_.push_back(r.slot);
  --in_kernel_;
  RequestState& s = requests_[request];

  int64_t res = r.result;
  if (options_.result_hook != nullptr) {
    res = options_.result_hook->AdjustResult(p.op, p.offset_bytes, p.length_bytes, res);
  }
  if (res == -ECANCELED) {
    s.cancelled = true;
    --s.pieces_live;
    MaybeComplete(request);
    return;
  }
  if (res == -EAGAIN || res == -EINTR) {
    if (retries + 1 > kMaxTransientRetries) {
      FinishPieceWithError(request, ErrnoToStatus(static_cast<int>(-res),
                                                  absl::StrCat(DescribePiece(s, p), " (gave up after ",
                                                               kMaxTransientRetries, " retries)")));
      return;
    }
    if (shut_down_ || !s.status.ok()) {
      s.cancelled = true;
      --s.pieces_live;
      MaybeComplete(request);
      return;
    }
    retry_queue_.push_back(RetryPiece{request, p, retries + 1});
    return;
  }
  if (res < 0) {
    FinishPieceWithError(request, ErrnoToStatus(static_cast<int>(-res), DescribePiece(s, p)));
    return;
  }
  uint64_t done = static_cast<uint64_t>(res);
  if (done > p.length_bytes) {
    FinishPieceWithError(request, absl::InternalError(absl::StrCat(
                                      DescribePiece(s, p), ": the kernel reported ", done, " bytes")));
    return;
  }
  if (done == p.length_bytes) {
    s.bytes_done += done;
    --s.pieces_live;
    MaybeComplete(request);
    return;
  }
  // Short transfer: resubmit the remainder. On an O_DIRECT file the remainder
  // must start aligned, so progress is rounded down to the alignment and the
  // tail of the short transfer is simply transferred again (idempotent for
  // both reads and writes of the same bytes).
  if (p.op == IoOp::kRead && done == 0) {
    FinishPieceWithError(request, absl::OutOfRangeError(absl::StrCat(
                                      DescribePiece(s, p), ": end of file after ",
                                      s.bytes_done, " bytes of the request")));
    return;
  }
  uint32_t alignment = files_[p.file_index].alignment;
  uint64_t progress = done - done % alignment;
  if (progress == 0) {
    if (retries + 1 > kMaxNoProgressRetries) {
      FinishPieceWithError(request, absl::DataLossError(absl::StrCat(
                                        DescribePiece(s, p), ": short transfers of ", done,
                                        " bytes made no aligned progress ", kMaxNoProgressRetries,
                                        " times (end of file, or a device returning partial blocks)")));
      return;
    }
    ++retries;
  } else {
    retries = 0;
  }
  s.bytes_done += progress;
  p.offset_bytes += progress;
  p.buffer += progress;
  p.length_bytes -= progress;
  if (shut_down_ || !s.status.ok()) {
    s.cancelled = true;
    --s.pieces_live;
    MaybeComplete(request);
    return;
  }
  retry_queue_.push_back(RetryPiece{request, p, retries});
}

absl::Status PieceEngine::Reap(size_t min_completions, absl::Duration timeout,
                               std::vector<IoCompletion>* out) {
  if (out == nullptr) return absl::InvalidArgumentError("Reap: out is null");
  size_t want = std::min(min_completions, outstanding_requests_);
  absl::Time deadline = timeout == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                            : absl::Now() + timeout;
  // Always look at the kernel at least once, even when enough completions are
  // already waiting: a non-blocking Reap(0) is how callers that compute
  // between completions (ExtentStore's checksums) keep the queue full.
  bool polled = false;
  while (true) {
    STRATA_RETURN_IF_ERROR(Pump());
    bool enough = ready_.size() >= want;
    if (enough && polled) break;
    if (in_kernel_ == 0) {
      if (!enough && (!retry_queue_.empty() || !issue_queue_.empty())) {
        return absl::InternalError(absl::StrCat(info_.name, " backend accepted no I/O with none in flight"));
      }
      break;
    }
    absl::Duration left = enough ? absl::ZeroDuration()
                          : deadline == absl::InfiniteFuture()
                              ? absl::InfiniteDuration()
                              : std::max(absl::ZeroDuration(), deadline - absl::Now());
    results_.clear();
    STRATA_RETURN_IF_ERROR(KernelWait(left, &results_));
    polled = true;
    for (const KernelResult& r : results_) HandleResult(r);
    if (results_.empty() && left == absl::ZeroDuration()) {
      STRATA_RETURN_IF_ERROR(Pump());
      break;
    }
  }
  while (!ready_.empty()) {
    out->push_back(std::move(ready_.front()));
    ready_.pop_front();
    --outstanding_requests_;
  }
  return absl::OkStatus();
}

void PieceEngine::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // Unissued remainders and pending retries never reach the kernel.
  std::vector<uint32_t> touched(issue_queue_.begin(), issue_queue_.end());
  issue_queue_.clear();
  for (uint32_t r : touched) requests_[r].cancelled = true;
  while (!retry_queue_.empty()) {
    RetryPiece r = retry_queue_.front();
    retry_queue_.pop_front();
    requests_[r.request].cancelled = true;
    --requests_[r.request].pieces_live;
    touched.push_back(r.request);
  }
  for (uint32_t r : touched) {
    if (requests_[r].in_use) MaybeComplete(r);
  }
  KernelCancelAll();
  // Pieces in the kernel own their buffers until they finish: wait for them.
  while (in_kernel_ > 0) {
    results_.clear();
    absl::Status s = KernelWait(absl::InfiniteDuration(), &results_);
    if (!s.ok()) {
      // A backend that cannot wait any more cannot give buffers back either;
      // continuing would let the caller free memory the kernel still writes.
      std::fprintf(stderr, "strata: %s shutdown cannot wait for I/O: %s\n", info_.name.c_str(),
                   s.ToString().c_str());
      std::abort();
    }
    for (const KernelResult& r : results_) HandleResult(r);
  }
}

}  // namespace strata::internal
