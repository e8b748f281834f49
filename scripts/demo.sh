#!/usr/bin/env bash
# The main job: set up, build, plan a model's memory, start stratad, and train
# a small model as 2 ranks through it in three modes -- no offload,
# ZeRO-Offload (optimizer on the daemon's CPU) and ZeRO-Infinity (params and
# optimizer states on NVMe) -- then check the three runs' losses are equal.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${STRATA_SKIP_DEPS:-0}" != "1" ]; then bash scripts/install_deps.sh; fi
bash scripts/build.sh

echo "== strata plan: 1e9 parameters on one 16 GB GPU, 64 GB CPU memory, 1 TB NVMe"
./build/bin/strata plan --params 1e9 --gpus-per-node 1 --gpu-mem 16GB --cpu-mem 64GB --nvme 1TB

# NVMe files need a file system with O_DIRECT (not tmpfs): keep them in build/.
run_dir=$(mktemp -d "$PWD/build/demo.XXXXXX")
socket="$run_dir/stratad.sock"
cleanup() {
  if [ -n "${pid:-}" ] && kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid"; wait "$pid" || true; fi
  rm -rf "$run_dir"
}
trap cleanup EXIT
echo "== stratad: starting (log in $run_dir/stratad.log)"
./build/bin/stratad --socket "$socket" --nvme_path "$run_dir/nvme" --nvme_capacity 1GiB \
  --device emulated >"$run_dir/stratad.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "stratad ready" "$run_dir/stratad.log" && break; sleep 0.1; done
grep -q "stratad ready" "$run_dir/stratad.log" || { cat "$run_dir/stratad.log"; exit 1; }
grep "stratad: " "$run_dir/stratad.log" | sed 's/^.*stratad: /  /'

for mode in local offload infinity; do
  echo "== strata-train-example --mode $mode --ranks 2 --steps 10"
  ./build/bin/strata-train-example --mode "$mode" --ranks 2 --steps 10 --socket "$socket" \
    | tee "$run_dir/$mode.log"
done
./build/bin/strata jobs --socket "$socket"
./build/bin/strata stats --socket "$socket"

if diff <(grep '^step' "$run_dir/local.log") <(grep '^step' "$run_dir/offload.log") >/dev/null &&
   diff <(grep '^step' "$run_dir/local.log") <(grep '^step' "$run_dir/infinity.log") >/dev/null; then
  echo "== the three modes produced identical losses"
else
  echo "== the losses differ between modes" >&2
  exit 1
fi
kill -TERM "$pid"
wait "$pid"
pid=""
echo "== stratad stopped cleanly"

echo "== a small GPT-style PyTorch model: 2 ranks through stratad (ZeRO-Offload) next to torch.optim.AdamW"
bash scripts/train_gpt.sh
