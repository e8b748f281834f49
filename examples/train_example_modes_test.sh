#!/usr/bin/env bash
# End to end: starts a real stratad (emulated device with a budget smaller
# than the model, NVMe directory under the build tree), runs
# strata-train-example in local, offload and infinity mode with 2 ranks, and
# checks that all three exit 0 and print identical step lines: the daemon's
# optimizer step is bit for bit the in-process one.
# Usage: train_example_modes_test.sh <strata-train-example> <stratad> <work dir>
set -u
example=$1
stratad=$2
work=$3
steps=${STEPS:-5}

. "$(dirname "$0")/../tests/train_harness.sh"

# The model is 26,122 fp32 params (~102 KiB): a 64 KiB device tier cannot
# hold it. 256 MiB of NVMe extents is plenty and keeps the build tree small.
start_stratad strata-modes --nvme_capacity 256MiB --device emulated --device_capacity 64KiB
for mode in local offload infinity; do
  run_example "$mode" --mode "$mode" --socket "$sock_dir/s.sock" --nvme_path "$work/nvme" --stats
done
# Infinity keeps params and optimizer states on NVMe: its job must have
# written there (the stats line reads "... nvme read <n> B  written <n> B ...").
written=$(sed -nE 's/.*train-example-infinity.* written ([0-9]+) B.*/\1/p' "$work/infinity.err")
if [ -z "$written" ] || [ "$written" -eq 0 ]; then
  echo "FAIL: the infinity job wrote nothing to NVMe (stats: ${written:-missing})"
  cat "$work/infinity.err"; status=1
else
  echo "infinity job wrote $written bytes to NVMe"
fi
for mode in offload infinity; do
  if ! diff -u "$work/local.out" "$work/$mode.out"; then
    echo "FAIL: --mode $mode losses differ from --mode local"; status=1
  fi
done
finish "local, offload and infinity printed identical losses for $steps steps"
