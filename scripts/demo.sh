#!/usr/bin/env bash
# The main job: set up, build, plan a model's memory, and run the daemon.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${STRATA_SKIP_DEPS:-0}" != "1" ]; then bash scripts/install_deps.sh; fi
bash scripts/build.sh

echo "== strata plan: 1e9 parameters on one 16 GB GPU, 64 GB CPU memory, 1 TB NVMe"
./build/bin/strata plan --params 1e9 --gpus-per-node 1 --gpu-mem 16GB --cpu-mem 64GB --nvme 1TB

run_dir=$(mktemp -d /tmp/strata-demo.XXXXXX)
trap 'rm -rf "$run_dir"' EXIT
echo "== stratad: start, report configuration, stop on SIGTERM"
./build/bin/stratad --socket "$run_dir/stratad.sock" --device emulated --device_capacity 256MiB \
  --pinned_capacity 256MiB >"$run_dir/stratad.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "stratad ready" "$run_dir/stratad.log" && break; sleep 0.1; done
kill -TERM "$pid"
wait "$pid"
cat "$run_dir/stratad.log"
