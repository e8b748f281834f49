// `strata bench rpc`: the cost of talking to stratad. Round-trip latency
// (p50/p99) of a no-op call and of GradReady -- through the doorbell (shared
// memory, docs/DAEMON.md) and, as its peer, through gRPC, while the daemon
// keeps a background job stepping -- calls per second with several
// concurrent client processes, and the shared-memory hand-off of a gradient
// bucket (write into the mapped slot + GradReady + Flush) against a plain
// memcpy of the same bytes into private memory. Starts its own stratad unless
// --socket names one; the output says what each measured call does.
#ifndef STRATA_BENCH_RPC_BENCH_H_
#define STRATA_BENCH_RPC_BENCH_H_

namespace strata {

// argv[0] is "rpc". Returns 0 on success, 1 when a measurement failed, 2 on
// bad usage (one line on stderr naming the flag).
int RunRpcBench(int argc, char** argv);

}  // namespace strata

#endif  // STRATA_BENCH_RPC_BENCH_H_
