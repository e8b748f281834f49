#include "tiers/testing/fault_injection_tier.h"

#include "absl/strings/str_cat.h"

namespace strata {

void FaultInjectionTier::FailNthRead(uint64_t n) {
  absl::MutexLock lock(&mu_);
  fail_read_at_ = n == 0 ? 0 : reads_ + n;
}

void FaultInjectionTier::FailNthWrite(uint64_t n) {
  absl::MutexLock lock(&mu_);
  fail_write_at_ = n == 0 ? 0 : writes_ + n;
}

void FaultInjectionTier::CloseReadGate() {
  absl::MutexLock lock(&mu_);
  gate_open_ = false;
}

void FaultInjectionTier::OpenReadGate() {
  absl::MutexLock lock(&mu_);
  gate_open_ = true;
}

void FaultInjectionTier::AwaitReadsStarted(uint64_t n) {
  absl::MutexLock lock(&mu_);
  auto started = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reads_ >= n; };
  mu_.Await(absl::Condition(&started));
}

uint64_t FaultInjectionTier::reads() const {
  absl::MutexLock lock(&mu_);
  return reads_;
}

uint64_t FaultInjectionTier::writes() const {
  absl::MutexLock lock(&mu_);
  return writes_;
}

absl::Status FaultInjectionTier::Write(const TierSlot& slot, absl::Span<const std::byte> src) {
  {
    absl::MutexLock lock(&mu_);
    ++writes_;
    if (writes_ == fail_write_at_) {
      return absl::DataLossError(absl::StrCat("injected failure of write #", writes_));
    }
  }
  return base_->Write(slot, src);
}

absl::Status FaultInjectionTier::Read(const TierSlot& slot, absl::Span<std::byte> dst) {
  {
    absl::MutexLock lock(&mu_);
    ++reads_;
    const bool fail = reads_ == fail_read_at_;
    mu_.Await(absl::Condition(this, &FaultInjectionTier::GateOpen));
    if (fail) return absl::DataLossError(absl::StrCat("injected failure of read #", reads_));
  }
  return base_->Read(slot, dst);
}

}  // namespace strata
