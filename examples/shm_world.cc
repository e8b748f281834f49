#include "examples/shm_world.h"

#include <pthread.h>
#include <sys/mman.h>

#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "core/errno_status.h"
#include "core/status_macros.h"

namespace strata {

struct ShmWorld::Header {
  pthread_barrier_t barrier;
};

namespace {

// The float areas start on a cache line of their own, apart from the barrier.
constexpr size_t kHeaderBytes = 256;
static_assert(sizeof(pthread_barrier_t) <= kHeaderBytes);

}  // namespace

absl::StatusOr<std::unique_ptr<ShmWorld>> ShmWorld::Create(uint32_t world_size,
                                                            uint64_t capacity) {
  if (world_size == 0) return absl::InvalidArgumentError("ShmWorld: world_size is 0");
  if (capacity == 0) return absl::InvalidArgumentError("ShmWorld: capacity is 0");
  // world_size contribution slots for the all-reduce, plus one gather area.
  const size_t bytes = kHeaderBytes + (static_cast<size_t>(world_size) + 1) * capacity * sizeof(float);
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    return ErrnoToStatus(errno, absl::StrCat("mapping ", bytes, " bytes shared between the ranks"));
  }
  auto* header = new (base) Header;
  pthread_barrierattr_t attr;
  pthread_barrierattr_init(&attr);
  // PTHREAD_PROCESS_SHARED: the barrier lives in pages the forked ranks share.
  int err = pthread_barrierattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  if (err == 0) err = pthread_barrier_init(&header->barrier, &attr, world_size);
  pthread_barrierattr_destroy(&attr);
  if (err != 0) {
    munmap(base, bytes);
    return ErrnoToStatus(err, "creating the ranks' process-shared barrier");
  }
  return std::unique_ptr<ShmWorld>(new ShmWorld(base, bytes, world_size, capacity));
}

ShmWorld::ShmWorld(void* base, size_t bytes, uint32_t world_size, uint64_t capacity)
    : base_(base), bytes_(bytes), world_size_(world_size), capacity_(capacity) {}

ShmWorld::~ShmWorld() {
  // No pthread_barrier_destroy: glibc's waits for every waiter to leave the
  // barrier, and a rank killed inside it never will. A barrier holds no
  // resource beyond its bytes, which the unmap releases.
  munmap(base_, bytes_);
}

float* ShmWorld::Slot(uint32_t rank) {
  return reinterpret_cast<float*>(static_cast<char*>(base_) + kHeaderBytes) +
         static_cast<size_t>(rank) * capacity_;
}

float* ShmWorld::Gather() { return Slot(world_size_); }

void ShmWorld::Barrier() {
  // pthread_barrier_wait has acquire/release semantics (POSIX memory
  // synchronization), which orders the plain stores into the shared areas
  // before a barrier against the loads after it.
  int rc = pthread_barrier_wait(&static_cast<Header*>(base_)->barrier);
  STRATA_CHECK(rc == 0 || rc == PTHREAD_BARRIER_SERIAL_THREAD);
}

void ShmWorld::AllReduceAverage(uint32_t rank, absl::Span<float> data) {
  STRATA_CHECK(rank < world_size_ && data.size() <= capacity_);
  std::memcpy(Slot(rank), data.data(), data.size() * sizeof(float));
  Barrier();
  const float n = static_cast<float>(world_size_);
  for (size_t i = 0; i < data.size(); ++i) {
    float sum = Slot(0)[i];
    for (uint32_t r = 1; r < world_size_; ++r) sum += Slot(r)[i];
    data[i] = sum / n;
  }
  // Nobody may overwrite its slot for the next collective while another rank
  // still reads this one.
  Barrier();
}

void ShmWorld::AllGather(uint32_t rank, absl::Span<const FlatRun> owned,
                         absl::Span<const FlatRun> wanted, absl::Span<float> flat) {
  STRATA_CHECK(rank < world_size_ && flat.size() <= capacity_);
  float* gather = Gather();
  for (const FlatRun& run : owned) {
    STRATA_CHECK(run.offset + run.numel <= flat.size());
    std::memcpy(gather + run.offset, flat.data() + run.offset, run.numel * sizeof(float));
  }
  Barrier();
  for (const FlatRun& run : wanted) {
    STRATA_CHECK(run.offset + run.numel <= flat.size());
    std::memcpy(flat.data() + run.offset, gather + run.offset, run.numel * sizeof(float));
  }
  Barrier();
}

}  // namespace strata
