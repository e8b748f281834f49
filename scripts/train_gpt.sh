#!/usr/bin/env bash
# Trains a small GPT-style PyTorch model as 2 ranks (torch.distributed, gloo)
# through a private stratad in ZeRO-Offload -- with strata's own gradient
# hooks, under DDP, and from a DeepSpeed config via st.initialize -- and in
# ZeRO-Infinity (stage 3 module hooks, params and optimizer state on NVMe),
# next to DDP + torch.optim.AdamW in-process, and prints the loss curves side by side.
#
#   bash scripts/train_gpt.sh [--steps N] [--ranks N] [--modes torch,offload,...]
#
# Uses the project's venv (scripts/venv.sh: torch, DeepSpeed) and the package
# staged by the build in build/python (the same one `pip install ./python` installs).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${STRATA_PYTHON:-$(bash scripts/venv.sh)/bin/python}"
if [ "${STRATA_SKIP_BUILD:-0}" != "1" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_PYTHON="$PY" >/dev/null
  cmake --build build -j "${STRATA_JOBS:-2}" --target stratad strata_python
fi
run_dir=$(mktemp -d "${TMPDIR:-/tmp}/strata-gpt.XXXXXX")
# NVMe files need a file system with O_DIRECT (not tmpfs): keep them in build/.
nvme_dir=$(mktemp -d "$PWD/build/gpt-nvme.XXXXXX")
cleanup() {
  if [ -n "${pid:-}" ] && kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid"; wait "$pid" || true; fi
  rm -rf "$run_dir" "$nvme_dir"
}
trap cleanup EXIT
./build/bin/stratad --socket "$run_dir/stratad.sock" --device emulated --optimizer_threads 1 \
  --nvme_path "$nvme_dir" --nvme_capacity 256MiB >"$run_dir/stratad.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "stratad ready" "$run_dir/stratad.log" && break; sleep 0.1; done
grep -q "stratad ready" "$run_dir/stratad.log" || { cat "$run_dir/stratad.log"; exit 1; }
echo "== stratad ready at $run_dir/stratad.sock"
PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu \
  "$PY" examples/train_gpt.py --socket "$run_dir/stratad.sock" "$@"
kill -TERM "$pid"; wait "$pid"; pid=""
echo "== stratad stopped cleanly"
