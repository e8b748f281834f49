#include "tiers/transfer_executor.h"

#include <utility>

namespace strata {

absl::StatusOr<std::unique_ptr<ThreadPoolExecutor>> ThreadPoolExecutor::Create(int threads) {
  if (threads < 1) return absl::InvalidArgumentError("transfer executor: threads must be >= 1");
  return std::unique_ptr<ThreadPoolExecutor>(new ThreadPoolExecutor(threads));
}

ThreadPoolExecutor::ThreadPoolExecutor(int threads) {
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

ThreadPoolExecutor::~ThreadPoolExecutor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ThreadPoolExecutor::Schedule(std::function<void()> work) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(work));
}

void ThreadPoolExecutor::Loop() {
  while (true) {
    std::function<void()> work;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ThreadPoolExecutor::HasWorkOrStopping));
      if (queue_.empty()) return;  // stopping and drained
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work();
  }
}

}  // namespace strata
