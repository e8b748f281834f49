// Transfer: the handle a TieredStore returns for an asynchronous promotion or
// demotion, to wait on or poll.
//
// Thread-safe. Shared by the store and every caller that asked for the same
// movement (two Promote calls for one in-flight copy get the same Transfer).
#ifndef STRATA_TIERS_TRANSFER_H_
#define STRATA_TIERS_TRANSFER_H_

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace strata {

class Transfer {
 public:
  // True once the movement finished, successfully or not.
  bool done() const { return done_.HasBeenNotified(); }
  // Blocks until done; returns how it ended.
  absl::Status Wait() const {
    done_.WaitForNotification();
    absl::MutexLock lock(&mu_);
    return status_;
  }
  // Like Wait, but gives up at `deadline`: DeadlineExceeded if not done.
  absl::Status WaitUntil(absl::Time deadline) const {
    if (!done_.WaitForNotificationWithDeadline(deadline)) {
      return absl::DeadlineExceededError("the transfer did not finish in time");
    }
    absl::MutexLock lock(&mu_);
    return status_;
  }
  // Bytes this transfer moved up (the promotion itself) and down (write-backs
  // of the dirty copies it evicted, or the demotion). Final once done().
  uint64_t bytes_up() const {
    absl::MutexLock lock(&mu_);
    return bytes_up_;
  }
  uint64_t bytes_down() const {
    absl::MutexLock lock(&mu_);
    return bytes_down_;
  }

  // For the store: records the outcome and wakes waiters. Called once.
  void Finish(absl::Status status, uint64_t bytes_up, uint64_t bytes_down) {
    {
      absl::MutexLock lock(&mu_);
      status_ = std::move(status);
      bytes_up_ = bytes_up;
      bytes_down_ = bytes_down;
    }
    done_.Notify();
  }
  // A transfer that had nothing to do.
  static std::shared_ptr<Transfer> Completed() {
    auto t = std::make_shared<Transfer>();
    t->Finish(absl::OkStatus(), 0, 0);
    return t;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_up_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_down_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification done_;
};

using TransferHandle = std::shared_ptr<Transfer>;

}  // namespace strata

#endif  // STRATA_TIERS_TRANSFER_H_
