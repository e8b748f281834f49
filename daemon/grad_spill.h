// GradSpill: ZeRO-Infinity's gradients when the job's window has no room for
// them. A gradient arrives in its slot of the exchange region (the trainer
// writes it); once inspected (overflow, norm), a gradient over the window's
// budget is written to NVMe under its own key and its slot's memory is given
// back. The write is asynchronous: Spill copies the gradient into one of two
// write buffers and returns (the slot may go at once); the write runs while
// the job inspects the next gradients, one write at a time, in spill order
// (so a re-spilled shard's last copy wins). A failed write is reported by the
// next Spill, or by the step's read-back (Next): either way the step fails
// and nothing of it is committed. The optimizer step reads the spilled gradients back, in step order,
// into two staging buffers of the largest gradient slot: while the step uses
// one shard's gradient, the next spilled one is read into the other buffer.
//
// The spilled copies are scratch: the job deletes them before the step's
// commit (RunStep), so no commit makes them durable, and a restart (which
// keeps only committed writes) or a rollback never sees them.
//
// Key: ShardKey{job, rank, tensor = shard index, kind = kGrad, index = 0}; one
// version per shard (the next step's spill replaces it).
//
// Thread-compatible: the job's turns (Inspect, RunStep) run one at a time.
#ifndef STRATA_DAEMON_GRAD_SPILL_H_
#define STRATA_DAEMON_GRAD_SPILL_H_

#include <cstddef>
#include <cstdint>
#include <future>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/shard_key.h"
#include "daemon/shard_state_store.h"
#include "swap/aligned_buffer.h"

namespace strata {

class ExtentStore;

class GradSpill {
 public:
  // `largest_bytes`: the largest gradient slot of the job (the staging size).
  static absl::StatusOr<std::unique_ptr<GradSpill>> Create(uint64_t job_id, ExtentStore* store,
                                                           uint64_t largest_bytes);
  ~GradSpill();

  static ShardKey Key(uint64_t job_id, uint32_t rank, uint32_t index);

  // Writes `grad` (aligned: a slot) as shard (rank, index)'s spilled gradient:
  // copies it and starts the write (waiting for the write before the last,
  // whose buffer it reuses). An error is this spill's or an earlier write's.
  absl::Status Spill(uint32_t rank, uint32_t index, absl::Span<const std::byte> grad);
  // Waits for the writes in flight; the first write error since the last
  // Flush, if any.
  absl::Status Flush();

  // The optimizer step: `order` is the spilled shards in the order the step
  // visits them, each with its slot's byte size; the writes end first, then
  // reading the first starts. A failed write makes every Next fail.
  void BeginReadback(std::vector<std::pair<ShardId, uint64_t>> order);
  // The gradient of the next shard of the order (which must be `id`), once
  // read; the read of the one after starts into the other buffer. Valid until
  // the next call.
  absl::StatusOr<const std::byte*> Next(const ShardId& id);
  // Waits for a read still running (a step cut short) before the buffers go.
  void EndReadback();
  // Deletes every spilled copy the job wrote (uncommitted writes: a delete
  // makes them net nothing in the next commit).
  void DeleteAll();

  // The read-back's two buffers and the writes' two.
  uint64_t staging_bytes() const { return 4 * buffer_bytes_; }
  uint64_t spilled_bytes() const { return spilled_bytes_; }
  uint64_t read_back_bytes() const { return read_back_bytes_; }

 private:
  GradSpill(uint64_t job_id, ExtentStore* store, uint64_t buffer_bytes)
      : job_id_(job_id), store_(store), buffer_bytes_(buffer_bytes) {}
  void StartRead(size_t pos);

  const uint64_t job_id_;
  ExtentStore* const store_;
  const uint64_t buffer_bytes_;
  AlignedBuffer buffers_[2];
  AlignedBuffer write_buffers_[2];
  std::future<absl::Status> writes_[2];
  uint64_t writes_started_ = 0;
  absl::Status write_error_;  // the first failed write since the last Flush
  std::vector<std::pair<ShardId, uint64_t>> order_;
  absl::Status readback_error_;  // a spill write that failed before this read-back
  size_t next_ = 0;
  std::future<absl::Status> reads_[2];
  std::vector<std::pair<uint32_t, uint32_t>> written_;  // keys to delete
  uint64_t spilled_bytes_ = 0;                          // totals, for stats and tests
  uint64_t read_back_bytes_ = 0;
};

}  // namespace strata

#endif  // STRATA_DAEMON_GRAD_SPILL_H_
