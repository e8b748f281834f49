// RunRanks: starts the ranks of a data-parallel job as separate processes on
// this machine and waits for them, as torchrun or deepspeed's launcher would.
//
// Ranks are fork()ed children running `body(rank)`: nothing is exec'd, so
// state the launcher set up before the fork (the ShmWorld region) is shared
// with them. The launcher must not have started threads or gRPC before the
// fork; each rank creates its own. A rank whose body returns an error prints
// "rank <r>: <status>" to stderr and exits 1. When a rank fails, the launcher
// sends SIGTERM to the ranks still running (they may be waiting on the dead
// one in a collective) and reports every failure.
#ifndef STRATA_EXAMPLES_RANK_LAUNCHER_H_
#define STRATA_EXAMPLES_RANK_LAUNCHER_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace strata {

// OK when every rank's body returned OK. Otherwise Aborted, naming each rank
// that failed or could not be forked and how (exit status or signal), first
// failure first; waitpid's errno as a Status if waiting itself fails.
absl::Status RunRanks(uint32_t world_size, absl::FunctionRef<absl::Status(uint32_t rank)> body);

}  // namespace strata

#endif  // STRATA_EXAMPLES_RANK_LAUNCHER_H_
