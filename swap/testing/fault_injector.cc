#include "swap/testing/fault_injector.h"

#include <cerrno>

namespace strata {

int64_t FaultInjector::AdjustResult(IoOp op, uint64_t offset_bytes, uint64_t length_bytes,
                                    int64_t result) {
  if (result < 0) return result;
  std::optional<FaultRule> rule =
      schedule_.Next(op, tags_ != nullptr ? tags_->TagAt(offset_bytes) : std::nullopt);
  if (!rule.has_value()) return result;
  switch (rule->kind) {
    case FaultKind::kEio: ++applied_; return -EIO;
    case FaultKind::kEnospc: ++applied_; return -ENOSPC;
    case FaultKind::kEagain: ++applied_; return -EAGAIN;
    case FaultKind::kEintr: ++applied_; return -EINTR;
    case FaultKind::kShortTransfer: {
      uint64_t half = length_bytes / 2;
      half -= half % alignment_;
      if (half == 0 || static_cast<uint64_t>(result) <= half) return result;
      ++applied_;
      return static_cast<int64_t>(half);
    }
    case FaultKind::kDelay:
    case FaultKind::kTornWrite:
      return result;  // request-level faults: see FaultInjectionIoEngine
  }
  return result;
}

}  // namespace strata
