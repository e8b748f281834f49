// PsyncEngine: the IoEngine over pread/pwrite on a pool of worker threads.
//
// Always available (no kernel AIO interface needed), so it is the last
// fallback and the engine of choice for file systems where O_DIRECT is
// refused. Each worker performs one pread/pwrite per piece and reports the raw
// result; PieceEngine handles short transfers and retries exactly as for the
// kernel engines, so all three keep one contract.
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "core/status_macros.h"
#include "swap/io_engine.h"
#include "swap/piece_engine.h"

namespace strata {
namespace {

class PsyncEngine final : public internal::PieceEngine {
 public:
  explicit PsyncEngine(const IoEngineOptions& options) : PieceEngine(options, "psync") {
    uint32_t n = options.psync_threads != 0 ? options.psync_threads
                                            : std::min<uint32_t>(options.queue_depth, 32);
    workers_.reserve(n);
    for (uint32_t i = 0; i < n; ++i) workers_.emplace_back([this] { WorkerLoop(); });
  }

  ~PsyncEngine() override {
    Shutdown();
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (std::thread& t : workers_) t.join();
  }

 private:
  absl::StatusOr<size_t> KernelSubmit(absl::Span<const uint32_t> slots) override {
    absl::MutexLock lock(&mu_);
    queue_.insert(queue_.end(), slots.begin(), slots.end());
    return slots.size();
  }

  absl::Status KernelWait(absl::Duration timeout, std::vector<KernelResult>* results) override {
    absl::MutexLock lock(&mu_);
    if (done_.empty() && timeout > absl::ZeroDuration()) {
      mu_.AwaitWithTimeout(absl::Condition(this, &PsyncEngine::HasResults), timeout);
    }
    results->insert(results->end(), done_.begin(), done_.end());
    done_.clear();
    return absl::OkStatus();
  }

  void KernelCancelAll() override {
    // Pieces still queued have not touched their buffers; running ones finish.
    absl::MutexLock lock(&mu_);
    for (uint32_t slot : queue_) done_.push_back(KernelResult{slot, -ECANCELED});
    queue_.clear();
  }

  bool HasResults() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !done_.empty(); }
  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }

  void WorkerLoop() {
    while (true) {
      uint32_t slot;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &PsyncEngine::HasWorkOrStop));
        if (queue_.empty()) return;  // stop_
        slot = queue_.front();
        queue_.pop_front();
      }
      // The piece was written before the slot was queued under mu_, and is
      // not touched again until its result is taken under mu_.
      const internal::KernelPiece& p = piece(slot);
      ssize_t n = p.op == IoOp::kRead
                      ? pread(p.fd, p.buffer, p.length_bytes, static_cast<off_t>(p.offset_bytes))
                      : pwrite(p.fd, p.buffer, p.length_bytes, static_cast<off_t>(p.offset_bytes));
      int64_t result = n >= 0 ? n : -errno;
      absl::MutexLock lock(&mu_);
      done_.push_back(KernelResult{slot, result});
    }
  }

  absl::Mutex mu_;
  std::deque<uint32_t> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<KernelResult> done_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> NewPsyncEngine(const IoEngineOptions& options) {
  STRATA_RETURN_IF_ERROR(ValidateIoEngineOptions(options));
  return std::unique_ptr<IoEngine>(new PsyncEngine(options));
}

}  // namespace strata
