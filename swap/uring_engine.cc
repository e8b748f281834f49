// UringEngine: the IoEngine over io_uring (liburing 2.3).
//
// One ring per engine for its whole life (a ring per batch costs a few
// syscalls and a page mapping every time). The ring has queue_depth entries;
// PieceEngine never keeps more than queue_depth pieces in flight, so neither
// the submission nor the completion queue can overflow. Requests in
// registered buffers use READ_FIXED/WRITE_FIXED, which skips the per-I/O page
// pinning (get_user_pages) that dominates the CPU cost at high IOPS; this is
// what fio's --fixedbufs measures.
#include <liburing.h>
#include <sys/resource.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"
#include "core/errno_status.h"
#include "core/status_macros.h"
#include "swap/io_engine.h"
#include "swap/piece_engine.h"

namespace strata {
namespace {

// user_data of our own cancel requests; real pieces use their slot index.
constexpr uint64_t kCancelTag = ~uint64_t{0} - 1;

__kernel_timespec ToKernelTimespec(absl::Duration d) {
  __kernel_timespec ts{};
  int64_t ns = absl::ToInt64Nanoseconds(d);
  ts.tv_sec = ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  return ts;
}

// Raises the soft (and, when privileged, hard) RLIMIT_MEMLOCK to at least
// `bytes`. Returns the resulting soft limit.
rlim_t RaiseMemlockLimit(uint64_t bytes) {
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 0;
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= bytes) return rl.rlim_cur;
  rlimit want = rl;
  if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= bytes) {
    want.rlim_cur = bytes;
  } else {
    want.rlim_cur = bytes;
    want.rlim_max = bytes;  // needs CAP_SYS_RESOURCE; fails quietly without
  }
  if (setrlimit(RLIMIT_MEMLOCK, &want) == 0) return want.rlim_cur;
  return rl.rlim_cur;
}

class UringEngine final : public internal::PieceEngine {
 public:
  static absl::StatusOr<std::unique_ptr<IoEngine>> Create(const IoEngineOptions& options) {
    std::unique_ptr<UringEngine> e(new UringEngine(options));
    STRATA_RETURN_IF_ERROR(e->Init(options));
    return std::unique_ptr<IoEngine>(std::move(e));
  }

  ~UringEngine() override {
    Shutdown();
    if (ring_ready_) io_uring_queue_exit(&ring_);
  }

 private:
  explicit UringEngine(const IoEngineOptions& options)
      : PieceEngine(options, "io_uring"), options_(options) {}

  absl::Status Init(const IoEngineOptions& options) {
    io_uring_params params{};
    if (options.sqpoll) {
      params.flags |= IORING_SETUP_SQPOLL;
      params.sq_thread_idle = static_cast<uint32_t>(absl::ToInt64Milliseconds(options.sqpoll_idle));
    }
    int ret = io_uring_queue_init_params(options.queue_depth, &ring_, &params);
    if (ret < 0 && options.sqpoll) {
      AddNote(absl::StrCat("SQPOLL off: the kernel refused it (", ErrnoName(-ret),
                           "); it needs CAP_SYS_NICE before Linux 5.11"));
      params = io_uring_params{};
      ret = io_uring_queue_init_params(options.queue_depth, &ring_, &params);
    }
    if (ret < 0) {
      return absl::UnimplementedError(absl::StrCat(
          "io_uring_queue_init failed: ", std::strerror(-ret), " (", ErrnoName(-ret),
          "); io_uring may be disabled (sysctl kernel.io_uring_disabled, seccomp) or the kernel "
          "is older than 5.6; use libaio or psync"));
    }
    ring_ready_ = true;
    info_.sqpoll = (params.flags & IORING_SETUP_SQPOLL) != 0;
    // IORING_OP_READ/WRITE (Linux 5.6) avoid an iovec per piece.
    io_uring_probe* probe = io_uring_get_probe_ring(&ring_);
    if (probe == nullptr) {
      return absl::UnimplementedError("io_uring: the kernel cannot be probed for opcodes (older than 5.6)");
    }
    bool ok = io_uring_opcode_supported(probe, IORING_OP_READ) &&
              io_uring_opcode_supported(probe, IORING_OP_WRITE);
    can_fixed_ = io_uring_opcode_supported(probe, IORING_OP_READ_FIXED) &&
                 io_uring_opcode_supported(probe, IORING_OP_WRITE_FIXED);
    can_cancel_any_ = io_uring_opcode_supported(probe, IORING_OP_ASYNC_CANCEL);
    io_uring_free_probe(probe);
    if (!ok) {
      return absl::UnimplementedError("io_uring lacks IORING_OP_READ/WRITE here (kernel older than 5.6)");
    }
    return absl::OkStatus();
  }

  void OnFilesChanged() override {
    if (info_.registered_files) {
      io_uring_unregister_files(&ring_);
      info_.registered_files = false;
    }
    if (!options_.register_files) return;
    std::vector<int> fds = FileDescriptors();
    if (fds.empty()) return;
    int ret = io_uring_register_files(&ring_, fds.data(), static_cast<unsigned>(fds.size()));
    if (ret < 0) {
      AddNote(absl::StrCat("registered files off: io_uring_register_files failed (", ErrnoName(-ret), ")"));
      return;
    }
    info_.registered_files = true;
  }

  void OnBuffersChanged() override {
    if (info_.registered_buffers) {
      io_uring_unregister_buffers(&ring_);
      info_.registered_buffers = false;
    }
    const auto& regions = buffer_regions();
    if (!options_.register_buffers || regions.empty()) return;
    if (!can_fixed_) {
      AddNote("registered buffers off: the kernel lacks READ_FIXED/WRITE_FIXED");
      return;
    }
    std::vector<iovec> iov;
    uint64_t total = 0;
    for (const auto& r : regions) {
      iov.push_back(iovec{r.base, r.length_bytes});
      total += r.length_bytes;
    }
    // Fixed buffers are pinned and charged to RLIMIT_MEMLOCK unless the
    // process has CAP_IPC_LOCK; raise the limit where we may.
    rlim_t limit = RaiseMemlockLimit(total + (uint64_t{64} << 20));
    int ret = io_uring_register_buffers(&ring_, iov.data(), static_cast<unsigned>(iov.size()));
    if (ret < 0) {
      std::string limit_text = limit == RLIM_INFINITY ? "unlimited" : FormatBytes(limit);
      AddNote(absl::StrCat("registered buffers off: registering ", FormatBytes(total),
                           " of I/O buffers failed (", ErrnoName(-ret), "): RLIMIT_MEMLOCK is ",
                           limit_text, "; raise `ulimit -l` or set register_buffers=false"));
      return;
    }
    info_.registered_buffers = true;
  }

  absl::StatusOr<size_t> KernelSubmit(absl::Span<const uint32_t> slots) override {
    size_t prepared = 0;
    for (uint32_t slot : slots) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) {
        // Cannot happen with at most queue_depth pieces in flight, but a full
        // SQ only means "later".
        break;
      }
      const internal::KernelPiece& p = piece(slot);
      int fd = info_.registered_files ? static_cast<int>(p.file_index) : p.fd;
      int buf_index = info_.registered_buffers ? FindBufferRegion(p.buffer, p.length_bytes) : -1;
      auto len = static_cast<unsigned>(p.length_bytes);
      if (p.op == IoOp::kRead) {
        if (buf_index >= 0) {
          io_uring_prep_read_fixed(sqe, fd, p.buffer, len, p.offset_bytes, buf_index);
        } else {
          io_uring_prep_read(sqe, fd, p.buffer, len, p.offset_bytes);
        }
      } else {
        if (buf_index >= 0) {
          io_uring_prep_write_fixed(sqe, fd, p.buffer, len, p.offset_bytes, buf_index);
        } else {
          io_uring_prep_write(sqe, fd, p.buffer, len, p.offset_bytes);
        }
      }
      if (info_.registered_files) sqe->flags |= IOSQE_FIXED_FILE;
      io_uring_sqe_set_data64(sqe, slot);
      ++prepared;
    }
    if (prepared == 0) return size_t{0};
    STRATA_RETURN_IF_ERROR(SubmitQueued());
    // Every prepared SQE is in the submission ring; if the kernel did not take
    // them all now (EAGAIN/EBUSY), the next enter does. An SQE the kernel
    // rejects still produces a CQE carrying the error.
    return prepared;
  }

  absl::Status SubmitQueued() {
    while (true) {
      int ret = io_uring_submit(&ring_);
      if (ret >= 0 || ret == -EAGAIN || ret == -EBUSY) return absl::OkStatus();
      if (ret == -EINTR) continue;
      return ErrnoToStatus(-ret, "io_uring_submit");
    }
  }

  absl::Status KernelWait(absl::Duration timeout, std::vector<KernelResult>* results) override {
    if (io_uring_sq_ready(&ring_) > 0) STRATA_RETURN_IF_ERROR(SubmitQueued());
    io_uring_cqe* cqe = nullptr;
    int ret;
    if (timeout == absl::InfiniteDuration()) {
      ret = io_uring_wait_cqe(&ring_, &cqe);
    } else if (timeout <= absl::ZeroDuration()) {
      ret = io_uring_peek_cqe(&ring_, &cqe);
    } else {
      __kernel_timespec ts = ToKernelTimespec(timeout);
      ret = io_uring_wait_cqe_timeout(&ring_, &cqe, &ts);
    }
    if (ret == -ETIME || ret == -EAGAIN || ret == -EINTR) return absl::OkStatus();
    if (ret < 0) return ErrnoToStatus(-ret, "waiting for io_uring completions");
    unsigned head;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      uint64_t tag = io_uring_cqe_get_data64(cqe);
      // Our cancel requests and liburing's internal timeouts are not pieces.
      if (tag == kCancelTag || tag == LIBURING_UDATA_TIMEOUT) continue;
      results->push_back(KernelResult{static_cast<uint32_t>(tag), cqe->res});
    }
    io_uring_cq_advance(&ring_, seen);
    return absl::OkStatus();
  }

  void KernelCancelAll() override {
    if (!can_cancel_any_) return;
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) return;
    // IORING_ASYNC_CANCEL_ANY (5.19) cancels everything not yet started;
    // block-device I/O already issued cannot be cancelled and completes
    // normally. Older kernels answer -EINVAL, which is harmless here.
    io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
    io_uring_sqe_set_data64(sqe, kCancelTag);
    (void)SubmitQueued();
  }

  IoEngineOptions options_;
  io_uring ring_{};
  bool ring_ready_ = false;
  bool can_fixed_ = false;
  bool can_cancel_any_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> NewUringEngine(const IoEngineOptions& options) {
  STRATA_RETURN_IF_ERROR(ValidateIoEngineOptions(options));
  return UringEngine::Create(options);
}

}  // namespace strata
