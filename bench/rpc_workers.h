// Concurrent clients for `strata bench rpc`: separate processes, as trainer
// ranks are, each with its own gRPC connection to the daemon (threads of one
// process could share one connection through gRPC's subchannel pool and
// measure that instead).
//
// The parent re-executes this binary as `strata bench rpc --worker_calls N
// --socket S` once per client. Each worker connects, warms up, reports ready,
// waits for the parent's start signal (its stdin closing), makes N no-op
// calls and prints its monotonic start and end times, so the parent computes
// calls per second over the span in which all clients ran.
#ifndef STRATA_BENCH_RPC_WORKERS_H_
#define STRATA_BENCH_RPC_WORKERS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace strata {

struct ConcurrentCallsResult {
  uint64_t calls = 0;       // over all clients
  uint64_t failed = 0;      // calls that returned an error
  double seconds = 0;       // first client's start to last client's end
  double calls_per_s = 0;
};

// Runs `clients` worker processes of `calls_per_client` no-op calls each
// against the daemon on `socket`. Unavailable when a worker fails to start
// or connect (its message says why).
absl::StatusOr<ConcurrentCallsResult> RunConcurrentNoopClients(const std::string& socket, int clients,
                                                               uint64_t calls_per_client);

// The worker side (stdin: start signal; stdout: protocol lines). Returns the
// process exit code.
int RunNoopWorker(const std::string& socket, uint64_t calls);

}  // namespace strata

#endif  // STRATA_BENCH_RPC_WORKERS_H_
