// PinnedBudget: the daemon's pinned host memory (--pinned_capacity) shared
// by every job. A job reserves what it will pin -- its ranks' exchange
// regions, its host-resident optimizer states, its NVMe staging -- before
// allocating any of it, and gives it back when it is destroyed. A request
// that does not fit is ResourceExhausted naming the numbers.
//
// Thread-safe.
#ifndef STRATA_DAEMON_PINNED_BUDGET_H_
#define STRATA_DAEMON_PINNED_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace strata {

class PinnedBudget {
 public:
  explicit PinnedBudget(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // Move-only; returns its bytes to the budget when destroyed.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation();
    uint64_t bytes() const { return bytes_; }

   private:
    friend class PinnedBudget;
    Reservation(PinnedBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
    PinnedBudget* budget_ = nullptr;
    uint64_t bytes_ = 0;
  };

  // `what` names the requester in the error ("job 'gpt'").
  absl::StatusOr<Reservation> Reserve(uint64_t bytes, const std::string& what);
  uint64_t capacity() const { return capacity_; }
  uint64_t used() const;

 private:
  void Give(uint64_t bytes);
  const uint64_t capacity_;
  mutable absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace strata

#endif  // STRATA_DAEMON_PINNED_BUDGET_H_
