#!/usr/bin/env bash
# stratad starts, reports its configuration, and stops cleanly on SIGTERM;
# a bad flag value exits 2 naming the field.
set -u
stratad=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$stratad" --socket "$dir/s.sock" --device emulated --io_engine psync >"$dir/log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "stratad ready" "$dir/log" && break; sleep 0.1; done
grep -q "stratad ready" "$dir/log" || { echo "FAIL: not ready"; cat "$dir/log"; exit 1; }
grep -q "io_engine: psync" "$dir/log" || { echo "FAIL: configuration not reported"; cat "$dir/log"; exit 1; }
kill -TERM "$pid"
wait "$pid"; rc=$?
[ "$rc" -eq 0 ] || { echo "FAIL: exit $rc after SIGTERM"; cat "$dir/log"; exit 1; }
grep -q "stopped cleanly" "$dir/log" || { echo "FAIL: no clean stop"; cat "$dir/log"; exit 1; }
"$stratad" --socket "$dir/s.sock" --io_engine spdk >"$dir/bad" 2>&1; rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: bad io_engine exited $rc"; exit 1; }
grep -q "io_engine" "$dir/bad" || { echo "FAIL: error does not name io_engine"; cat "$dir/bad"; exit 1; }
# --pin_optimizer_threads: the optimizer's workers each run on one CPU of the
# daemon's affinity set (worker k on CPU k of the set; the caller stays free).
"$stratad" --socket "$dir/p.sock" --device emulated --io_engine psync --optimizer_threads 2 \
  --pin_optimizer_threads >"$dir/pin" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "stratad ready" "$dir/pin" && break; sleep 0.1; done
grep -q "workers pinned to CPUs" "$dir/pin" || { echo "FAIL: pinning not reported"; cat "$dir/pin"; kill "$pid"; exit 1; }
ncpus=$(grep -o "pinned to CPUs [0-9,]*" "$dir/pin" | awk -F'CPUs ' '{print split($2, cpu, ",")}')
if [ "$ncpus" -gt 1 ]; then
  single=0
  for t in /proc/"$pid"/task/*; do
    list=$(awk '/Cpus_allowed_list/ {print $2}' "$t/status")
    case "$list" in *[,-]*) ;; *) single=$((single + 1)) ;; esac
  done
  [ "$single" -ge 1 ] || { echo "FAIL: no thread of stratad is pinned to one CPU"; kill "$pid"; exit 1; }
fi
kill -TERM "$pid"; wait "$pid" || { echo "FAIL: pinned daemon did not stop cleanly"; exit 1; }
echo "stratad_lifecycle_test: all checks passed"
