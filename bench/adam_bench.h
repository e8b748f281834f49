// `strata bench adam`: the CPU optimizer step at the memory-bandwidth limit.
// In one run, on the same buffers: our AdamW with fp32 grads, fp16 grads and
// fp16 params out, bf16 in and out; Adagrad and Lion with fp16; a bandwidth
// probe with the optimizer's memory pattern (the limit); and
// torch.optim.AdamW (foreach on and off, default and tuned glibc malloc)
// through /usr/bin/python3 as the peer. Prints a table; --json writes it.
// See docs/OPTIMIZER.md.
#ifndef STRATA_BENCH_ADAM_BENCH_H_
#define STRATA_BENCH_ADAM_BENCH_H_

namespace strata {

// argv[0] is "adam". Returns 0 on success, 1 when a measurement failed, 2 on
// bad usage (one line on stderr naming the flag).
int RunAdamBench(int argc, char** argv);

}  // namespace strata

#endif  // STRATA_BENCH_ADAM_BENCH_H_
