// `strata bench train`: a ~100M-param GPT trained a few iterations with torch
// AdamW (fused) in-process, DeepSpeed ZeRO-2 + CPU offload, DeepSpeed ZeRO-3
// Infinity and strata offload: step time and peak memory of trainer and
// daemon, with ratios to DeepSpeed's offload step. The measuring is done by
// bench/train_bench.py in the project's venv (every variant is a PyTorch
// training script); this command finds that Python and runs it.
#ifndef STRATA_BENCH_TRAIN_BENCH_H_
#define STRATA_BENCH_TRAIN_BENCH_H_

namespace strata {

// argv[0] is "train". --python PATH picks the venv's Python; every other
// flag goes to train_bench.py (--json FILE, --steps, --variants, ...).
// Returns the script's exit status, 2 on bad usage, 1 when it cannot start.
int RunTrainBench(int argc, char** argv);

}  // namespace strata

#endif  // STRATA_BENCH_TRAIN_BENCH_H_
