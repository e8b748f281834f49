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

# The socket lives in a short /tmp path (sun_path holds 108 bytes); the NVMe
# files under the build tree, on a real file system that takes O_DIRECT.
sock_dir=$(mktemp -d /tmp/strata-modes.XXXXXX)
rm -rf "$work"
mkdir -p "$work/nvme"
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ]; then kill -TERM "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null; fi
  # Keep the logs and outputs for a look after a failure, not the NVMe files.
  rm -rf "$sock_dir" "$work/nvme"
}
trap cleanup EXIT

# The model is 26,122 fp32 params (~102 KiB): a 64 KiB device tier cannot
# hold it. 256 MiB of NVMe extents is plenty and keeps the build tree small.
"$stratad" --socket "$sock_dir/s.sock" --nvme_path "$work/nvme" --nvme_capacity 256MiB \
  --device emulated --device_capacity 64KiB >"$work/stratad.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 1 100); do grep -q "stratad ready" "$work/stratad.log" && break; sleep 0.1; done
grep -q "stratad ready" "$work/stratad.log" || {
  echo "FAIL: stratad did not become ready"; cat "$work/stratad.log"; exit 1; }

status=0
for mode in local offload infinity; do
  if ! timeout 300 "$example" --mode "$mode" --ranks 2 --steps "$steps" --socket "$sock_dir/s.sock" \
      --nvme_path "$work/nvme" --stats >"$work/$mode.out" 2>"$work/$mode.err"; then
    echo "FAIL: --mode $mode exited non-zero"; cat "$work/$mode.err"; status=1
  fi
  echo "--- $mode"; cat "$work/$mode.out"
  lines=$(grep -cE '^step [0-9]+ loss [0-9.eE+-]+$' "$work/$mode.out")
  if [ "$lines" -ne "$steps" ]; then
    echo "FAIL: --mode $mode printed $lines well-formed step lines, expected $steps"; status=1
  fi
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
if [ "$status" -ne 0 ]; then echo "--- stratad log"; tail -50 "$work/stratad.log"; exit 1; fi
echo "PASS: local, offload and infinity printed identical losses for $steps steps"
