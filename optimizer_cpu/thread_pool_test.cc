#include "optimizer_cpu/thread_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

std::unique_ptr<ThreadPool> MakePool(int threads, std::vector<int> cpus = {}) {
  ThreadPoolOptions options;
  options.num_threads = threads;
  options.pin_cpus = std::move(cpus);
  auto pool = ThreadPool::Create(options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? std::move(*pool) : nullptr;
}

TEST(ThreadPoolTest, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    auto pool = MakePool(threads);
    ASSERT_NE(pool, nullptr);
    EXPECT_EQ(pool->num_threads(), threads);
    for (size_t tasks : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{1000}}) {
      std::vector<std::atomic<int>> hits(tasks);
      pool->ParallelFor(tasks, [&](size_t t) { hits[t].fetch_add(1); });
      for (size_t t = 0; t < tasks; ++t) ASSERT_EQ(hits[t].load(), 1) << threads << "/" << t;
    }
  }
}

// Back-to-back loops: a worker that has not yet gone back to sleep must still
// see the next loop (this hung once, when workers read the generation late).
TEST(ThreadPoolTest, ManyShortLoopsInARowComplete) {
  auto pool = MakePool(3);
  ASSERT_NE(pool, nullptr);
  std::atomic<size_t> total{0};
  for (int loop = 0; loop < 5000; ++loop) {
    pool->ParallelFor(3, [&](size_t) { total.fetch_add(1, std::memory_order_relaxed); });
  }
  EXPECT_EQ(total.load(), 15000u);
}

TEST(ThreadPoolTest, UsesWorkerThreadsAndTheCaller) {
  auto pool = MakePool(2);
  ASSERT_NE(pool, nullptr);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> caller_ran{false}, worker_ran{false};
  std::atomic<int> arrived{0};
  // Both threads must be inside the loop at once: each task waits for the
  // other, so the loop only completes if two threads run it.
  pool->ParallelFor(2, [&](size_t) {
    (std::this_thread::get_id() == caller ? caller_ran : worker_ran).store(true);
    arrived.fetch_add(1);
    while (arrived.load() < 2) std::this_thread::yield();
  });
  EXPECT_TRUE(caller_ran.load());
  EXPECT_TRUE(worker_ran.load());
}

TEST(ThreadPoolTest, ConcurrentCallersAreSerialized) {
  auto pool = MakePool(2);
  ASSERT_NE(pool, nullptr);
  std::atomic<size_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int loop = 0; loop < 500; ++loop) {
        pool->ParallelFor(5, [&](size_t) { total.fetch_add(1); });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4u * 500 * 5);
}

TEST(ThreadPoolTest, PinsWorkersToTheGivenCpus) {
  auto pool = MakePool(2, {0, 0});
  ASSERT_NE(pool, nullptr);
  std::atomic<int> arrived{0};
  std::atomic<int> worker_cpu{-1};
  const std::thread::id caller = std::this_thread::get_id();
  pool->ParallelFor(2, [&](size_t) {
    if (std::this_thread::get_id() != caller) worker_cpu.store(sched_getcpu());
    arrived.fetch_add(1);
    while (arrived.load() < 2) std::this_thread::yield();
  });
  EXPECT_EQ(worker_cpu.load(), 0);
}

TEST(ThreadPoolTest, BadOptionsAreInvalidArgument) {
  ThreadPoolOptions options;
  options.num_threads = 0;
  EXPECT_EQ(ThreadPool::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.num_threads = 2;
  options.pin_cpus = {-1};
  EXPECT_EQ(ThreadPool::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
