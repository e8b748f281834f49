// The trainer's side of the doorbell (core/doorbell_layout.h): RankSession
// uses it for GradReady and WaitStep when the daemon offered one, and falls
// back to gRPC whenever the page cannot answer (the job closed or failed, a
// step the page does not describe): the fallback gives the exact error.
//
// Internal to the client library. Thread-compatible, like RankSession.
#ifndef STRATA_CLIENT_DOORBELL_CLIENT_H_
#define STRATA_CLIENT_DOORBELL_CLIENT_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/doorbell_layout.h"
#include "core/unix_socket.h"

namespace strata {

struct DoorbellStepOutcome {
  bool skipped = false;
  double loss_scale = 1.0;
  double grad_norm = 0.0;
  uint64_t optimizer_steps = 0;
};

class ClientDoorbell {
 public:
  // Maps the page (checking its header) and keeps the eventfd.
  static absl::StatusOr<std::unique_ptr<ClientDoorbell>> Map(UniqueFd memfd, UniqueFd eventfd, uint64_t bytes);
  ~ClientDoorbell();
  ClientDoorbell(const ClientDoorbell&) = delete;
  ClientDoorbell& operator=(const ClientDoorbell&) = delete;

  // Whether a GradReady(index, step) can go through the ring: the page is
  // open, says `step` is the step taking gradients, and index is a shard of
  // this rank. Otherwise gRPC gives the answer (and the error) it always did.
  bool CanSignal(uint32_t index, uint64_t step, size_t shards) const;
  // Publishes the signal and rings; waits (up to `timeout`) only when the
  // ring is full. Returns first any refusal the daemon reported for an
  // earlier signal.
  // `grad_bytes` is the signaled slot's size, counted against the gradient
  // window until the daemon takes the signal.
  absl::Status Signal(uint32_t index, uint64_t step, uint64_t grad_bytes, absl::Duration timeout);
  // Waits until the rank's gradient window (doorbell::Shared::grad_room_bytes)
  // has room for `bytes` more, beside `unsignaled` bytes of slots written and
  // not yet signaled; at once when the page sets no limit, closed or failed
  // (the next GradReady says why). DeadlineExceeded names the figures.
  absl::Status WaitGradRoom(uint64_t bytes, uint64_t unsignaled, absl::Duration timeout);
  // Waits until the daemon has taken every signal published so far and
  // returns a refusal it reported, if any. Unavailable when the page closed
  // or the job failed (ask gRPC why).
  absl::Status Flush(absl::Duration timeout);
  // Step `step`'s outcome once the daemon published it; nullopt when the
  // page cannot say (closed, failed, a step other than the open one and not
  // in the page's history, or `timeout`): then ask gRPC. A refusal the daemon
  // reported meanwhile is returned as the error.
  absl::StatusOr<std::optional<DoorbellStepOutcome>> WaitStep(uint64_t step, absl::Duration timeout);
  // Steps finished, as the page says (for the gRPC fallback).
  uint64_t done_steps() const;

 private:
  ClientDoorbell() = default;
  enum class Wait { kDone, kStop, kRefused, kTimeout };
  // Spins briefly, then futex-waits on the page's epoch until `done()`.
  template <typename Done>
  Wait WaitFor(Done done, absl::Duration timeout);
  bool Refused() const;
  absl::Status TakeRefusal();

  doorbell::Shared* shared_ = nullptr;
  UniqueFd memfd_;
  UniqueFd eventfd_;
  uint64_t tail_ = 0;        // ours: what we published
  // Our signals the daemon may not have taken yet: (ring position, gradient
  // bytes), oldest first; dropped once the page's head passes them.
  std::deque<std::pair<uint64_t, uint64_t>> untaken_;
  // Drops the entries of untaken_ the page's head has passed.
  void ForgetTaken();
  uint64_t error_seen_ = 0;  // the page's error_seq we have reported
};

}  // namespace strata

#endif  // STRATA_CLIENT_DOORBELL_CLIENT_H_
