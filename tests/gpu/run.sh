#!/usr/bin/env bash
# The GPU check, for a machine with an NVIDIA GPU (the device tool's H200):
# builds with CUDA (or uses a build carried in), runs the CUDA tests, `strata
# bench tiers` on the GPU against cudaMemcpyAsync, and a small ZeRO-Infinity
# run through stratad on its device tier (--device cuda; params acquired into
# the GPU arena, a park to NVMe and a resume mid-training, timed), writing
# every result into one folder. Bounded to about
# 8 minutes: each step has its own timeout and a failed step does not stop the
# next one; the exit status is the number of failed steps.
#
#   bash tests/gpu/run.sh [OUT_DIR]          # default: $OUT, else build-gpu/results
#   STRATA_GPU_BUILD=build bash tests/gpu/run.sh   # reuse an existing build tree
#
# Without a GPU the CUDA tests skip with the driver's reason and the bench
# falls back to the emulated device; the script says so in summary.txt.
# STRATA_GPU_DEVICE=emulated runs the bench and the daemon on the emulated
# device (a rehearsal of the script on a machine without a GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-build-gpu/results}}"
mkdir -p "$out"
build="${STRATA_GPU_BUILD:-build-gpu}"
failed=0
step() {  # step NAME SECONDS COMMAND...
  local name="$1" seconds="$2"; shift 2
  local start=$SECONDS
  timeout "$seconds" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  printf '%-14s rc=%-3s %4ss  %s\n' "$name" "$rc" "$((SECONDS - start))" "$*" | tee -a "$out/summary.txt"
  if [ "$rc" -ne 0 ]; then failed=$((failed + 1)); fi
  return 0
}
: >"$out/summary.txt"
{ date -u; uname -a; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || true
  lscpu | grep -E 'Model name|Flags' | cut -c1-200; } >"$out/machine.txt" 2>&1

if [ ! -x "$build/bin/strata-bench" ]; then
  step configure 120 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTRATA_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90
  step build 300 cmake --build "$build" -j "$(nproc)" --target tiers_test strata-bench stratad strata \
    strata-train-example
fi
# The CUDA device's conformance tests (they skip, naming the driver's error, without a GPU).
step cuda_tests 60 "$build/tests/tiers_test" --gtest_filter='*Cuda*' --gtest_output="xml:$out/cuda_tests.xml"
grep -q 'SKIPPED' "$out/cuda_tests.log" && \
  echo "note: some CUDA tests skipped (no usable GPU?): see cuda_tests.log" | tee -a "$out/summary.txt"
# pinned <-> device <-> NVMe against cudaMemcpyAsync from cudaHostAlloc memory.
step bench_tiers 120 "$build/bin/strata-bench" tiers --device "${STRATA_GPU_DEVICE:-cuda}" --size "${STRATA_GPU_TIERS_SIZE:-2GiB}" --chunk 64MiB --rounds 3 \
  --dir "${STRATA_GPU_NVME:-/var/tmp}" --json "$out/tiers.json"
# ZeRO-Infinity through a private stratad serving its device tier (the GPU's arena by CUDA IPC;
# emulated without a GPU), 2 ranks, params acquired into the device tier with a device budget
# smaller than the model's params, parked to NVMe and resumed after step 5, checked against
# local mode.
sock_dir="$(mktemp -d)"
nvme_dir="$(mktemp -d "${STRATA_GPU_NVME:-/var/tmp}/strata-gpu-XXXX")"
"$build/bin/stratad" --socket "$sock_dir/stratad.sock" --nvme_path "$nvme_dir" --nvme_capacity 4GiB \
  --device "${STRATA_GPU_DEVICE:-cuda}" --device_capacity 256MiB >"$out/stratad.log" 2>&1 &
daemon=$!
for _ in $(seq 50); do [ -S "$sock_dir/stratad.sock" ] && break; sleep 0.2; done
grep -E 'device tier' "$out/stratad.log" | tee -a "$out/summary.txt"
step infinity 120 "$build/bin/strata-train-example" --mode infinity --ranks 2 --steps 10 \
  --socket "$sock_dir/stratad.sock" --device_tier --device_budget 112KiB --park_after_step 5 --park_tier nvme \
  --stats
step local 60 "$build/bin/strata-train-example" --mode local --ranks 2 --steps 10
# The park / resume timings (shards, bytes, seconds, GB/s) the example printed.
grep -E '^(park|resume) ' "$out/infinity.log" | tee "$out/park_resume.txt" | tee -a "$out/summary.txt"
if diff <(grep '^step' "$out/infinity.log") <(grep '^step' "$out/local.log") >"$out/loss_diff.txt"; then
  echo "infinity (device tier, parked and resumed) losses equal local mode's, bit for bit" | tee -a "$out/summary.txt"
else
  echo "infinity losses DIFFER from local mode's: see loss_diff.txt" | tee -a "$out/summary.txt"
  failed=$((failed + 1))
fi
kill -TERM "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null
rm -rf "$sock_dir" "$nvme_dir"
echo "failed steps: $failed" | tee -a "$out/summary.txt"
exit "$failed"
