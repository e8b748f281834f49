// FaultPolicy: which faults a test injects into I/O, and when.
//
// A policy is a list of rules; each rule names a fault and fires on the n-th
// matching event, or at random with a probability drawn from a seeded
// generator (the same seed gives the same faults), at most `max_fires` times.
// Defaults are "no fault". Shared by FaultInjector (kernel-result level,
// beneath an engine's retry logic) and FaultInjectionIoEngine (request level,
// above an engine).
#ifndef STRATA_SWAP_TESTING_FAULT_POLICY_H_
#define STRATA_SWAP_TESTING_FAULT_POLICY_H_

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "swap/io_engine.h"

namespace strata {

enum class FaultKind : uint8_t {
  kEio,            // the I/O fails with EIO
  kEnospc,         // the I/O fails with ENOSPC
  kShortTransfer,  // fewer bytes than asked are transferred (FaultInjector only)
  kEagain,         // EAGAIN (FaultInjector: beneath the retry logic)
  kEintr,          // EINTR (FaultInjector only)
  kDelay,          // the request is held back by `delay` on the Clock (engine decorator only)
  kTornWrite,      // only the first `torn_bytes` of a write reach the file, then EIO (decorator only)
};

struct FaultRule {
  FaultKind kind = FaultKind::kEio;
  // Only events of this op count and can fire; unset: both.
  std::optional<IoOp> only_op;
  // Only events of requests with this IoRequest::tag (the extent store's
  // owner: a job id) count and can fire; unset: every request.
  std::optional<uint64_t> only_tag;
  // Fire on the n-th matching event (1-based). 0: not by count.
  uint64_t nth = 0;
  // With nth: fire on the `run` matching events nth, nth+1, ... (a burst).
  uint64_t run = 1;
  // Else fire with this probability on every matching event.
  double probability = 0.0;
  // Stop after firing this many times; 0: no limit.
  uint64_t max_fires = 0;
  // kTornWrite: bytes written before the tear (rounded down to 4 KiB).
  uint64_t torn_bytes = 4096;
  // kTornWrite: the request completes OK instead of with EIO -- a tail the
  // device acknowledged but lost, which only a checksum on read can find.
  bool torn_silent = false;
  // kDelay.
  absl::Duration delay = absl::ZeroDuration();

  // Fires on the n-th event of `op` (both ops when unset).
  static FaultRule OnNth(FaultKind kind, uint64_t n, std::optional<IoOp> op = std::nullopt) {
    FaultRule r;
    r.kind = kind;
    r.nth = n;
    r.only_op = op;
    return r;
  }
  // Fires at random with `probability` on each event of `op`.
  static FaultRule Randomly(FaultKind kind, double probability,
                            std::optional<IoOp> op = std::nullopt) {
    FaultRule r;
    r.kind = kind;
    r.probability = probability;
    r.only_op = op;
    return r;
  }
};

struct FaultPolicy {
  std::vector<FaultRule> rules;
  uint64_t seed = 301;
};

// Decides, event by event, which rule fires. Thread-safe.
class FaultSchedule {
 public:
  explicit FaultSchedule(FaultPolicy policy);

  // Counts one event of `op` (of a request tagged `tag`, when known) and
  // returns the rule that fires on it, if any (the first in policy order).
  // Rules with only_tag match only events whose tag is known and equal.
  std::optional<FaultRule> Next(IoOp op, std::optional<uint64_t> tag = std::nullopt);

  // How many times rules of `kind` have fired.
  uint64_t fired(FaultKind kind) const;
  uint64_t events() const;

 private:
  mutable absl::Mutex mu_;
  FaultPolicy policy_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> matched_ ABSL_GUARDED_BY(mu_);  // per rule
  std::vector<uint64_t> fires_ ABSL_GUARDED_BY(mu_);    // per rule
  uint64_t events_ ABSL_GUARDED_BY(mu_) = 0;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata

#endif  // STRATA_SWAP_TESTING_FAULT_POLICY_H_
