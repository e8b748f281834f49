#!/usr/bin/env bash
# Runs strata-train-example in local mode (2 ranks, 5 steps) and checks that
# rank 0 printed exactly one well-formed "step <n> loss <x>" line per step,
# numbered 0..4, with finite losses, and that the loss fell.
# Usage: train_example_local_test.sh <path to strata-train-example>
set -euo pipefail
binary="$1"
steps=5

out="$("$binary" --mode local --ranks 2 --steps "$steps")" || {
  echo "FAIL: strata-train-example exited with status $?" >&2
  exit 1
}
echo "$out"

echo "$out" | awk -v steps="$steps" '
  {
    if (NF != 4 || $1 != "step" || $3 != "loss" || $2 != NR - 1 ||
        $4 !~ /^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$/) {
      printf "FAIL: line %d is not \"step %d loss <x>\": %s\n", NR, NR - 1, $0; bad = 1; exit 1
    }
    loss[NR] = $4 + 0
  }
  END {
    if (bad) exit 1
    if (NR != steps) { printf "FAIL: %d step lines, expected %d\n", NR, steps; exit 1 }
    if (!(loss[steps] < loss[1])) {
      printf "FAIL: the loss did not fall: step 0 %.9g, step %d %.9g\n", loss[1], steps - 1, loss[steps]
      exit 1
    }
    printf "PASS: %d steps, loss %.6f -> %.6f\n", steps, loss[1], loss[steps]
  }'
