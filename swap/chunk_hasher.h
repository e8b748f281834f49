// ChunkHasher: feeds byte ranges into StreamingChecksums on a thread of its
// own, in the order they were added.
//
// ExtentStore drives I/O from the caller's thread. Hashing a 64 MiB shard
// inline costs a few ms of CPU during which that thread cannot reap and
// refill the queue; worse, on a busy machine a thread that computes is
// preempted while one that sleeps in the kernel is woken promptly. Handing
// the hashing to this thread keeps the I/O thread asleep-or-submitting.
//
// Ranges are hashed one at a time in the order added, whichever thread does
// it: the hasher thread, or a caller in Drain()/TryHashOne() when the hasher
// has not picked the next range up yet. On a loaded machine the hasher can
// sit runnable-but-not-running for a whole scheduler slice (milliseconds);
// then the thread that is already running -- the I/O thread waiting for the
// device, or waiting in Drain for the last chunks -- hashes instead of
// sleeping, so the checksum's tail after the last completion stays one chunk.
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
  // Returns once every queued range has been hashed, hashing queued ranges
  // on the calling thread while the hasher thread is not running one.
  void Drain();
  // Hashes the oldest queued range on the calling thread if no thread is
  // hashing one now; false (at once) when there is none or one is running.
  bool TryHashOne();

 private:
  struct Job {
    StreamingChecksum* sum;
    const void* data;
    size_t size;
  };
  void Loop();
  // Pops the oldest job and marks it running; requires Claimable().
  Job Claim() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(const Job& job) ABSL_LOCKS_EXCLUDED(mu_);
  // One range is hashed at a time (a StreamingChecksum is fed in order).
  bool Claimable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !jobs_.empty() && !busy_; }
  bool ClaimableOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return Claimable() || (stop_ && Idle());
  }
  bool ClaimableOrIdle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return Claimable() || Idle(); }
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return jobs_.empty() && !busy_; }

  absl::Mutex mu_;
  std::deque<Job> jobs_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_SWAP_CHUNK_HASHER_H_
