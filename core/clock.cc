#include "core/clock.h"

#include "absl/time/clock.h"

namespace strata {

absl::Time RealClock::Now() const { return absl::Now(); }
void RealClock::SleepFor(absl::Duration duration) { absl::SleepFor(duration); }

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}
void FakeClock::SleepFor(absl::Duration duration) { Advance(duration); }
void FakeClock::Advance(absl::Duration duration) {
  absl::MutexLock lock(&mu_);
  now_ += duration;
}

}  // namespace strata
