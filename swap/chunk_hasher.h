// ChunkHasher: feeds byte ranges into StreamingChecksums on a thread of its
// own, in the order they were added.
//
// ExtentStore drives I/O from the caller's thread. Hashing a 64 MiB shard
// inline costs a few ms of CPU during which that thread cannot reap and
// refill the queue; worse, on a busy machine a thread that computes is
// preempted while one that sleeps in the kernel is woken promptly. Handing
// the hashing to this thread keeps the I/O thread asleep-or-submitting.
//
// Thread-safe. Ranges must stay valid and unchanged until Drain() returns.
#ifndef STRATA_SWAP_CHUNK_HASHER_H_
#define STRATA_SWAP_CHUNK_HASHER_H_

#include <cstddef>
#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "swap/checksum.h"

namespace strata {

class ChunkHasher {
 public:
  ChunkHasher();
  ~ChunkHasher();
  ChunkHasher(const ChunkHasher&) = delete;
  ChunkHasher& operator=(const ChunkHasher&) = delete;

  // Queues sum->Update(data, size). `sum` must outlive Drain().
  void Add(StreamingChecksum* sum, const void* data, size_t size);
  // Returns once every queued range has been hashed.
  void Drain();

 private:
  struct Job {
    StreamingChecksum* sum;
    const void* data;
    size_t size;
  };
  void Loop();
  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !jobs_.empty(); }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return jobs_.empty() && !busy_; }

  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_SWAP_CHUNK_HASHER_H_
