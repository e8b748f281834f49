// A persistent pool of worker threads for data-parallel loops.
//
// The optimizer step runs every few hundred milliseconds on gigabytes of
// state; creating threads per call (fork/join) would add tens of microseconds
// and lose cache and NUMA placement each time. The workers here live as long
// as the pool and sleep on a futex (std::atomic::wait) between calls.
//
// The calling thread takes part in every loop as thread 0, so a pool of one
// thread runs loops inline with no synchronization at all.
//
// Thread-safety: ParallelFor may be called from any thread; concurrent calls
// are serialized (a one-thread pool runs each inline in its caller). Not
// reentrant: `fn` must not call ParallelFor on the same pool.
#ifndef STRATA_OPTIMIZER_CPU_THREAD_POOL_H_
#define STRATA_OPTIMIZER_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace strata {

struct ThreadPoolOptions {
  // Threads that run each loop, the caller included. >= 1.
  int num_threads = 1;
  // If not empty, worker k (k = 1 .. num_threads-1) is pinned to CPU
  // pin_cpus[k % pin_cpus.size()]; the caller (thread 0) is left where it is
  // (a library should not move its caller), so put the caller's CPU first.
  std::vector<int> pin_cpus;
};

class ThreadPool final {
 public:
  // InvalidArgument for num_threads < 1 or > 1024, or a negative CPU id;
  // Internal if pinning a worker fails (e.g. a CPU outside the allowed set).
  static absl::StatusOr<std::unique_ptr<ThreadPool>> Create(const ThreadPoolOptions& options);

  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(task) once for every task in [0, num_tasks), spread over the
  // threads (each claims the next unclaimed task), and returns when all have
  // finished. Tasks are claimed in increasing order.
  void ParallelFor(size_t num_tasks, absl::FunctionRef<void(size_t)> fn);

 private:
  explicit ThreadPool(int num_threads);
  void WorkerLoop();
  void RunTasks();

  absl::Mutex call_mu_;  // serializes ParallelFor callers
  std::vector<std::thread> workers_;

  // The current loop. Written by the caller before `generation_` is bumped
  // (release) and read by workers after they observe the bump (acquire).
  const absl::FunctionRef<void(size_t)>* fn_ = nullptr;
  size_t num_tasks_ = 0;
  std::atomic<size_t> next_task_{0};
  std::atomic<uint32_t> generation_{0};
  // Workers still running the current loop; the last one wakes the caller.
  std::atomic<int> busy_workers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace strata

#endif  // STRATA_OPTIMIZER_CPU_THREAD_POOL_H_
