// Clock: the one source of time, so tests and simulations can replace it.
#ifndef STRATA_CORE_CLOCK_H_
#define STRATA_CORE_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace strata {

// Thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  virtual void SleepFor(absl::Duration duration) = 0;
};

// The system's monotonic-enough wall clock (absl::Now).
class RealClock final : public Clock {
 public:
  absl::Time Now() const override;
  void SleepFor(absl::Duration duration) override;
};

// Time stands still until the test advances it. SleepFor advances the clock by
// the duration instead of blocking, so simulated waits are exact.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() const override;
  void SleepFor(absl::Duration duration) override;
  void Advance(absl::Duration duration);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_CORE_CLOCK_H_
