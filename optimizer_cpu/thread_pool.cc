#include "optimizer_cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata {

absl::StatusOr<std::unique_ptr<ThreadPool>> ThreadPool::Create(const ThreadPoolOptions& options) {
  if (options.num_threads < 1 || options.num_threads > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "thread pool: num_threads is ", options.num_threads, "; it must be in [1, 1024]"));
  }
  for (int cpu : options.pin_cpus) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) {
      return absl::InvalidArgumentError(
          absl::StrCat("thread pool: CPU id ", cpu, " is out of range"));
    }
  }
  std::unique_ptr<ThreadPool> pool(new ThreadPool(options.num_threads));
  if (!options.pin_cpus.empty()) {
    for (size_t k = 0; k < pool->workers_.size(); ++k) {
      const int cpu = options.pin_cpus[(k + 1) % options.pin_cpus.size()];
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      const int err = pthread_setaffinity_np(pool->workers_[k].native_handle(), sizeof(set), &set);
      if (err != 0) {
        return absl::InternalError(absl::StrCat("thread pool: pinning worker ", k + 1,
                                                " to CPU ", cpu, " failed: ", std::strerror(err),
                                                "; check the CPU list against `nproc`/taskset"));
      }
    }
  }
  return pool;
}

ThreadPool::ThreadPool(int num_threads) {
  workers_.reserve(num_threads - 1);
  for (int k = 1; k < num_threads; ++k) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunTasks() {
  for (;;) {
    const size_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) return;
    (*fn_)(task);
  }
}

void ThreadPool::WorkerLoop() {
  // Workers start before the constructor returns, so before any loop: the
  // generation they have seen is the initial 0. (Loading it here instead
  // would miss a loop published before this thread got to run.)
  uint32_t seen = 0;
  for (;;) {
    generation_.wait(seen, std::memory_order_acquire);
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_relaxed)) return;
    RunTasks();
    // acq_rel: our tasks' writes happen before the caller's return.
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_workers_.notify_one();
  }
}

void ThreadPool::ParallelFor(size_t num_tasks, absl::FunctionRef<void(size_t)> fn) {
  if (num_tasks == 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (size_t task = 0; task < num_tasks; ++task) fn(task);
    return;
  }
  absl::MutexLock lock(&call_mu_);
  fn_ = &fn;
  num_tasks_ = num_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  // release: publishes fn_, num_tasks_ and the counters to the workers.
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  RunTasks();
  for (int busy = busy_workers_.load(std::memory_order_acquire); busy != 0;
       busy = busy_workers_.load(std::memory_order_acquire)) {
    busy_workers_.wait(busy, std::memory_order_acquire);
  }
  fn_ = nullptr;
}

}  // namespace strata
