#!/usr/bin/env bash
# End to end on the device tier (issue 10 item 3): a real stratad with an
# emulated device (--device emulated --device_capacity 256KiB), and
# strata-train-example in infinity mode acquiring its params into the device
# tier with a device budget (112 KiB) smaller than its params (26,122 fp32 =
# 102 KiB; 128 KiB of 4 KiB slots over both ranks), reading them from the
# arena it mapped. (The budget was 96 KiB: exactly the most both ranks pin at
# once, which fitted while an arena was twice its budget; in an arena of
# exactly the budget, pinned copies that cannot move leave it fragmented now
# and then -- 'fragmented' in about 1 run of 30 even with two-ended
# placement -- so the budget has room for that: 0 failures in 55 runs.) Its losses must equal local mode's bit for bit; so must a
# run parked to NVMe (and one to pinned host) after step 2 and resumed, which
# prints what moved and how long it took.
#
# With "window" as the fifth argument the same runs go through the pinned
# window instead (no --device_tier): park and resume of a job that never used
# the device tier.
# Usage: device_tier_train_test.sh <strata-train-example> <stratad> <strata> <work dir> [device|window]
set -u
example=$1
stratad=$2
strata=$3
work=$4
where=${5:-device}
steps=${STEPS:-5}

. "$(dirname "$0")/train_harness.sh"
start_stratad strata-device --nvme_capacity 256MiB --device emulated --device_capacity 256KiB
device=(--mode infinity --socket "$sock_dir/s.sock" --nvme_path "$work/nvme")
if [ "$where" = device ]; then device+=(--device_tier --device_budget 112KiB); fi
run_example local --mode local
run_example device "${device[@]}" --stats
run_example parked_nvme "${device[@]}" --park_after_step 2 --park_tier nvme
run_example parked_pinned "${device[@]}" --park_after_step 2 --park_tier pinned_host
for name in device parked_nvme parked_pinned; do
  if ! diff -u "$work/local.out" "$work/$name.out"; then
    echo "FAIL: $name losses differ from --mode local"; status=1
  fi
done
# The device tier was used: strata stats shows the job's device row (what
# it holds of its budget, and its device acquires, the first of them a miss).
if [ "$where" = device ]; then
  grep -qE "device   [0-9]+ of 114688 B  hits [0-9]+  misses [1-9][0-9]*  stall " "$work/device.err" || {
    echo "FAIL: the job's device row is not in its stats"; cat "$work/device.err"; status=1; }
fi
# Each park and resume said what it moved and how long it took. A park to
# NVMe moves every shard; one to pinned host moves the device tier's (none
# on the window, where nothing sits above pinned host).
for name in parked_nvme parked_pinned; do
  for what in park resume; do
    line=$(grep -E "^$what " "$work/$name.err")
    echo "$name: $line"
    shards=$(echo "$line" | sed -nE 's/.*: ([0-9]+) shards ([0-9]+) bytes .*/\1/p')
    if [ -z "$shards" ]; then
      echo "FAIL: $name: no $what line"; status=1
    elif [ "$shards" -eq 0 ] && { [ "$name" = parked_nvme ] || [ "$where" = device ]; }; then
      echo "FAIL: $name: $what moved no shards"; status=1
    fi
  done
done
# Every job's budget came back when its run deleted it.
"$strata" status --socket "$sock_dir/s.sock" | tee "$work/status.txt"
finish "infinity on the $where tier (and parked to NVMe and to pinned host) trained the same bits as local mode for $steps steps"
