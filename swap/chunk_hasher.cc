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

ChunkHasher::Job ChunkHasher::Claim() {
  Job job = jobs_.front();
  jobs_.pop_front();
  busy_ = true;
  return job;
}

void ChunkHasher::Run(const Job& job) {
  job.sum->Update(job.data, job.size);
  absl::MutexLock lock(&mu_);
  busy_ = false;
}

void ChunkHasher::Drain() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ChunkHasher::ClaimableOrIdle));
      if (Idle()) return;
      job = Claim();
    }
    Run(job);
  }
}

bool ChunkHasher::TryHashOne() {
  Job job;
  {
    absl::MutexLock lock(&mu_);
    if (!Claimable()) return false;
    job = Claim();
  }
  Run(job);
  return true;
}

void ChunkHasher::Loop() {
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ChunkHasher::ClaimableOrStop));
      if (!Claimable()) return;  // stop_ and nothing left
      job = Claim();
    }
    Run(job);
  }
}

}  // namespace strata
