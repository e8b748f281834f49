// FaultInjector: an IoResultHook that rewrites kernel results beneath an
// engine's retry logic, so tests prove what the engine does with short
// transfers, EAGAIN/EINTR, EIO and ENOSPC as if the kernel had returned them.
//
// Pass it as IoEngineOptions::result_hook; it must outlive the engine.
// Only successful kernel results are rewritten (a real error passes through).
// A short transfer keeps half the piece, rounded down to
// `short_transfer_alignment`; a piece no longer than that alignment cannot be
// shortened and passes unchanged. Thread-safe.
#ifndef STRATA_SWAP_TESTING_FAULT_INJECTOR_H_
#define STRATA_SWAP_TESTING_FAULT_INJECTOR_H_

#include <atomic>
#include <cstdint>

#include "swap/io_engine.h"
#include "swap/testing/fault_policy.h"
#include "swap/testing/in_flight_tags.h"

namespace strata {

class FaultInjector final : public IoResultHook {
 public:
  explicit FaultInjector(FaultPolicy policy, uint32_t short_transfer_alignment = 4096)
      : schedule_(std::move(policy)), alignment_(short_transfer_alignment) {}

  int64_t AdjustResult(IoOp op, uint64_t offset_bytes, uint64_t length_bytes,
                       int64_t result) override;

  const FaultSchedule& schedule() const { return schedule_; }
  // Results actually changed (a kShortTransfer rule that fires on a piece too
  // small to shorten changes nothing).
  uint64_t applied() const { return applied_.load(); }

  // Rules with only_tag then see the tag of the request a piece belongs to
  // (see InFlightTags). Borrowed; set before the engine runs.
  void set_in_flight_tags(const InFlightTags* tags) { tags_ = tags; }

 private:
  const InFlightTags* tags_ = nullptr;
  std::atomic<uint64_t> applied_{0};
  FaultSchedule schedule_;
  uint32_t alignment_;
};

}  // namespace strata

#endif  // STRATA_SWAP_TESTING_FAULT_INJECTOR_H_
