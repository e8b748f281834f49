// TransferExecutor: where the TieredStore runs the I/O of promotions,
// demotions and write-backs. ThreadPoolExecutor is the daemon's; the
// InlineExecutor runs each transfer in the thread that asked for it, which
// makes the store single-threaded and exactly repeatable for the simulated
// prefetch benchmark and for deterministic tests.
#ifndef STRATA_TIERS_TRANSFER_EXECUTOR_H_
#define STRATA_TIERS_TRANSFER_EXECUTOR_H_

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace strata {

class TransferExecutor {
 public:
  virtual ~TransferExecutor() = default;
  // Runs `work` eventually (inline executors: before returning). The store
  // never calls Schedule with its lock held.
  virtual void Schedule(std::function<void()> work) = 0;
};

class InlineExecutor final : public TransferExecutor {
 public:
  void Schedule(std::function<void()> work) override { work(); }
};

// A fixed pool of threads taking work in FIFO order. The destructor runs all
// work already scheduled, then joins. Thread-safe.
class ThreadPoolExecutor final : public TransferExecutor {
 public:
  // InvalidArgument unless threads >= 1.
  static absl::StatusOr<std::unique_ptr<ThreadPoolExecutor>> Create(int threads);
  ~ThreadPoolExecutor() override;
  void Schedule(std::function<void()> work) override;

 private:
  explicit ThreadPoolExecutor(int threads);
  void Loop();
  bool HasWorkOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace strata

#endif  // STRATA_TIERS_TRANSFER_EXECUTOR_H_
