// ShmWorld: the collectives the example's ranks use among themselves, as a
// real trainer would use NCCL or gloo: a barrier, an all-reduce that averages,
// and an all-gather of owned element runs.
//
// The launcher creates one ShmWorld before it forks the ranks: the region is
// an anonymous MAP_SHARED mapping, so every forked rank sees the same pages,
// with a process-shared pthread barrier at its head. No file, no name: only
// the launcher's children can reach it.
//
// Determinism: AllReduceAverage adds the ranks' contributions in rank order
// 0, 1, ..., N-1 on every rank, then divides by N, so every rank gets the same
// bits and so does every run, whatever the timing. That is what lets the
// three training modes print identical losses.
//
// Failure: a rank that dies leaves the others waiting in the barrier; the
// launcher (rank_launcher.h) notices the death and kills them.
//
// Thread-compatible within a rank; every rank must call the same sequence of
// collectives with the same sizes (as with NCCL).
#ifndef STRATA_EXAMPLES_SHM_WORLD_H_
#define STRATA_EXAMPLES_SHM_WORLD_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace strata {

// A run of elements of a flat buffer.
struct FlatRun {
  uint64_t offset = 0;
  uint64_t numel = 0;
};

class ShmWorld final {
 public:
  // Maps a region for `world_size` ranks exchanging up to `capacity` floats
  // per collective. InvalidArgument for world_size 0 or capacity 0; the
  // mmap/pthread error otherwise.
  static absl::StatusOr<std::unique_ptr<ShmWorld>> Create(uint32_t world_size, uint64_t capacity);

  // Unmaps. Only the launcher runs it, after every rank has exited (ranks
  // leave through _exit and never run it).
  ~ShmWorld();
  ShmWorld(const ShmWorld&) = delete;
  ShmWorld& operator=(const ShmWorld&) = delete;

  uint32_t world_size() const { return world_size_; }
  uint64_t capacity() const { return capacity_; }

  // Returns when every rank has called it.
  void Barrier();

  // Replaces `data` on every rank with the element-wise mean over ranks.
  // REQUIRES: data.size() <= capacity(), the same on every rank.
  void AllReduceAverage(uint32_t rank, absl::Span<float> data);

  // Each rank contributes the runs `owned` of its `flat` buffer (the runs of
  // different ranks must not overlap); afterwards, on every rank, the runs
  // `wanted` of `flat` hold what their owners contributed.
  // REQUIRES: the ranks' `owned` runs together cover `wanted` (an uncovered
  // element would read whatever an earlier gather left there); every run
  // ends within flat.size() <= capacity().
  void AllGather(uint32_t rank, absl::Span<const FlatRun> owned, absl::Span<const FlatRun> wanted,
                 absl::Span<float> flat);

 private:
  struct Header;
  ShmWorld(void* base, size_t bytes, uint32_t world_size, uint64_t capacity);
  float* Slot(uint32_t rank);  // this rank's all-reduce contribution
  float* Gather();             // the all-gather area, indexed like `flat`

  void* base_;
  size_t bytes_;
  uint32_t world_size_;
  uint64_t capacity_;
};

}  // namespace strata

#endif  // STRATA_EXAMPLES_SHM_WORLD_H_
