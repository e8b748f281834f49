#include "swap/chunk_hasher.h"

namespace strata {

ChunkHasher::ChunkHasher() : thread_([this] { Loop(); }) {}

ChunkHasher::~ChunkHasher() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void ChunkHasher::Add(StreamingChecksum* sum, const void* data, size_t size) {
  absl::MutexLock lock(&mu_);
  jobs_.push_back(Job{sum, data, size});
}

void ChunkHasher::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &ChunkHasher::Idle));
}

void ChunkHasher::Loop() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ChunkHasher::HasWorkOrStop));
      if (jobs_.empty()) return;  // stop_, nothing left
      job = jobs_.front();
      jobs_.pop_front();
      busy_ = true;
    }
    job.sum->Update(job.data, job.size);
    absl::MutexLock lock(&mu_);
    busy_ = false;
  }
}

}  // namespace strata
