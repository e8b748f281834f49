// AioEngine: the IoEngine over Linux native AIO (libaio).
//
// The fallback where io_uring is unavailable (disabled by sysctl or seccomp,
// older kernels). Native AIO is only asynchronous for O_DIRECT files; on
// buffered files io_submit performs the I/O before returning, which is
// correct but serial.
#include <libaio.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/errno_status.h"
#include "core/status_macros.h"
#include "swap/io_engine.h"
#include "swap/piece_engine.h"

namespace strata {
namespace {

class AioEngine final : public internal::PieceEngine {
 public:
  static absl::StatusOr<std::unique_ptr<IoEngine>> Create(const IoEngineOptions& options) {
    std::unique_ptr<AioEngine> e(new AioEngine(options));
    int ret = io_setup(static_cast<int>(options.queue_depth), &e->ctx_);
    if (ret < 0) {
      if (ret == -ENOSYS) {
        return absl::UnimplementedError("libaio: the kernel has no native AIO (ENOSYS); use psync");
      }
      if (ret == -EAGAIN) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "libaio: io_setup(", options.queue_depth,
            ") exceeds fs.aio-max-nr; raise it (sysctl fs.aio-max-nr) or lower queue_depth"));
      }
      return ErrnoToStatus(-ret, "libaio: io_setup");
    }
    e->ctx_ready_ = true;
    return std::unique_ptr<IoEngine>(std::move(e));
  }

  ~AioEngine() override {
    Shutdown();
    if (ctx_ready_) io_destroy(ctx_);
  }

 private:
  explicit AioEngine(const IoEngineOptions& options)
      : PieceEngine(options, "libaio"),
        iocbs_(options.queue_depth),
        in_kernel_(options.queue_depth, false),
        events_(options.queue_depth) {}

  absl::StatusOr<size_t> KernelSubmit(absl::Span<const uint32_t> slots) override {
    ptrs_.clear();
    for (uint32_t slot : slots) {
      const internal::KernelPiece& p = piece(slot);
      iocb& cb = iocbs_[slot];
      if (p.op == IoOp::kRead) {
        io_prep_pread(&cb, p.fd, p.buffer, p.length_bytes, static_cast<long long>(p.offset_bytes));
      } else {
        io_prep_pwrite(&cb, p.fd, p.buffer, p.length_bytes, static_cast<long long>(p.offset_bytes));
      }
      cb.data = reinterpret_cast<void*>(static_cast<uintptr_t>(slot));
      ptrs_.push_back(&cb);
    }
    size_t done = 0;
    while (done < ptrs_.size()) {
      int ret = io_submit(ctx_, static_cast<long>(ptrs_.size() - done), ptrs_.data() + done);
      if (ret > 0) {
        for (int i = 0; i < ret; ++i) {
          in_kernel_[reinterpret_cast<uintptr_t>(ptrs_[done + i]->data)] = true;
        }
        done += static_cast<size_t>(ret);
        continue;
      }
      if (ret == -EINTR) continue;
      if (ret == -EAGAIN || ret == 0) break;  // out of kernel resources: later
      // io_submit rejects the first iocb of the batch with its error (e.g.
      // EINVAL for a misaligned O_DIRECT piece); report it as that piece's
      // result and carry on with the rest.
      auto slot = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(ptrs_[done]->data));
      immediate_.push_back(KernelResult{slot, ret});
      ++done;
    }
    return done;
  }

  absl::Status KernelWait(absl::Duration timeout, std::vector<KernelResult>* results) override {
    if (!immediate_.empty()) {
      results->insert(results->end(), immediate_.begin(), immediate_.end());
      immediate_.clear();
      timeout = absl::ZeroDuration();  // collect whatever else is ready, no wait
    }
    timespec ts{};
    timespec* tsp = nullptr;
    if (timeout != absl::InfiniteDuration()) {
      int64_t ns = std::max<int64_t>(0, absl::ToInt64Nanoseconds(timeout));
      ts.tv_sec = ns / 1000000000;
      ts.tv_nsec = ns % 1000000000;
      tsp = &ts;
    }
    long min_nr = results->empty() ? 1 : 0;
    int ret = io_getevents(ctx_, min_nr, static_cast<long>(events_.size()), events_.data(), tsp);
    if (ret == -EINTR) return absl::OkStatus();
    if (ret < 0) return ErrnoToStatus(-ret, "libaio: io_getevents");
    for (int i = 0; i < ret; ++i) {
      auto slot = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(events_[i].data));
      in_kernel_[slot] = false;
      // res is the byte count or -errno squeezed into an unsigned long.
      results->push_back(KernelResult{slot, static_cast<long>(events_[i].res)});
    }
    return absl::OkStatus();
  }

  void KernelCancelAll() override {
    // File AIO is rarely cancellable (io_cancel answers EINVAL); whatever is
    // cancelled reports its event here instead of through io_getevents.
    for (uint32_t slot = 0; slot < in_kernel_.size(); ++slot) {
      if (!in_kernel_[slot]) continue;
      io_event ev{};
      if (io_cancel(ctx_, &iocbs_[slot], &ev) == 0) {
        in_kernel_[slot] = false;
        immediate_.push_back(KernelResult{slot, -ECANCELED});
      }
    }
  }

  io_context_t ctx_ = nullptr;
  bool ctx_ready_ = false;
  std::vector<iocb> iocbs_;  // indexed by slot; stable while in flight
  std::vector<bool> in_kernel_;
  std::vector<io_event> events_;
  std::vector<iocb*> ptrs_;
  std::vector<KernelResult> immediate_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> NewAioEngine(const IoEngineOptions& options) {
  STRATA_RETURN_IF_ERROR(ValidateIoEngineOptions(options));
  return AioEngine::Create(options);
}

}  // namespace strata
