#include "daemon/pinned_budget.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/byte_size.h"

namespace strata {

PinnedBudget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBudget::Reservation& PinnedBudget::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    if (budget_ != nullptr) budget_->Give(bytes_);
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedBudget::Reservation::~Reservation() {
  if (budget_ != nullptr) budget_->Give(bytes_);
}

absl::StatusOr<PinnedBudget::Reservation> PinnedBudget::Reserve(uint64_t bytes, const std::string& what) {
  absl::MutexLock lock(&mu_);
  if (bytes > capacity_ - used_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", FormatBytes(bytes), " (", bytes, " bytes) of pinned host memory, but only ",
        FormatBytes(capacity_ - used_), " of pinned_capacity ", FormatBytes(capacity_), " is free (",
        FormatBytes(used_), " used by other jobs); raise --pinned_capacity or shrink the job"));
  }
  used_ += bytes;
  return Reservation(this, bytes);
}

uint64_t PinnedBudget::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

void PinnedBudget::Give(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_ -= bytes;
}

}  // namespace strata
