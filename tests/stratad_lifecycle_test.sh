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
echo "stratad_lifecycle_test: all checks passed"
