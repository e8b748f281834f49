// FaultPlan: faults for a whole running daemon, from one line of text, for
// the test-only `stratad-faults` binary (tests/faults/). Production stratad
// neither links this nor has a flag for it.
//
//   --fault_plan 'tag=<job id>,op=write,kind=eio,after=3[,run=N][,delay_ms=D][,torn_bytes=B]; ...'
//
//   tag       the job (extent-store owner) whose I/O is hit; required, so a
//             plan always names one job and every other job is untouched
//   op        read | write (default: both)
//   kind      eio | enospc       the request fails with that errno
//             torn               a write reaches the file only in part
//                                (torn_bytes, default 4096), then EIO
//             torn_silent        the same, but reported as complete: only the
//                                checksum on read finds it
//             delay              the request waits delay_ms (default 200)
//             short              the kernel transfers half a piece (beneath
//                                the engine's retry logic, which must resubmit)
//   after     fire on the after-th matching I/O request of that job (pieces,
//             for `short`), counted from daemon start (default 1)
//   run       ... and on the run-1 after it (default 1)
//
// FaultPlanEngines then owns what the daemon's I/O lanes share: one schedule
// for request-level faults, the kernel-level injector (IoEngineOptions::
// result_hook) and the in-flight tag table that scopes it.
#ifndef STRATA_SWAP_TESTING_FAULT_PLAN_H_
#define STRATA_SWAP_TESTING_FAULT_PLAN_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "swap/io_engine.h"
#include "swap/testing/fault_injector.h"
#include "swap/testing/fault_policy.h"
#include "swap/testing/in_flight_tags.h"

namespace strata {

struct FaultPlan {
  FaultPolicy request_level;  // FaultInjectionIoEngine: eio, enospc, torn, delay
  FaultPolicy kernel_level;   // FaultInjector: short
  std::string description;    // for the daemon's startup log
};

// InvalidArgument naming the bad field.
absl::StatusOr<FaultPlan> ParseFaultPlan(absl::string_view text);

class FaultPlanEngines {
 public:
  explicit FaultPlanEngines(const FaultPlan& plan);

  // For IoEngineOptions::result_hook of every engine Wrap() will see.
  IoResultHook* result_hook() { return &injector_; }
  // An engine that injects the plan's request-level faults in front of
  // `inner` and owns it.
  std::unique_ptr<IoEngine> Wrap(std::unique_ptr<IoEngine> inner);
  // "fired: eio 1, enospc 0, ..." for the log at exit.
  std::string Summary() const;

 private:
  FaultSchedule schedule_;
  InFlightTags tags_;
  FaultInjector injector_;
};

}  // namespace strata

#endif  // STRATA_SWAP_TESTING_FAULT_PLAN_H_
