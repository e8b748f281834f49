// Scheduler hints for the daemon's latency-critical threads.
//
// The doorbell hub (daemon/doorbell.h) sleeps until a trainer rings and then
// does a few microseconds of work; the optimizer threads beside it run for
// seconds. On a machine whose cores are all busy stepping (the 2-core CI
// machine: every step), the scheduler decides how soon the hub runs after a
// ring. Linux's EEVDF scheduler (6.6+) gives each task a time slice and, since
// 6.12, lets a waking task with a shorter slice preempt the running one
// (sched_setattr's sched_runtime is the slice request for SCHED_OTHER,
// clamped to 0.1-100 ms). The hub asks for the shortest slice: it keeps its
// fair share of CPU (no real-time class, no privilege needed, a hub that
// spins cannot starve anyone) but no longer waits out an optimizer thread's
// slice -- which is what put grad_ready's p99 at ~150 us with p50 at 8 us.
#ifndef STRATA_DAEMON_SCHEDULER_HINT_H_
#define STRATA_DAEMON_SCHEDULER_HINT_H_

#include <cstdint>

#include "absl/status/status.h"

namespace strata {

// Asks the scheduler to give the calling thread a time slice of `slice_ns`
// (SCHED_OTHER, its nice value kept). Unimplemented where the kernel has no
// sched_setattr; InvalidArgument where it refuses the value. Older kernels
// (CFS, before 6.6) accept and ignore the slice: harmless.
absl::Status RequestShortSlice(uint64_t slice_ns);

// The calling thread's slice as the kernel reports it (sched_getattr), in ns;
// 0 when unknown.
uint64_t CurrentSliceNs();

}  // namespace strata

#endif  // STRATA_DAEMON_SCHEDULER_HINT_H_
