# Sourced by the end-to-end training tests (examples/train_example_modes_test.sh,
# tests/device_tier_train_test.sh): one private stratad per test and runs of
# strata-train-example whose losses the caller compares.
#
# The caller sets: example (strata-train-example), stratad, work (a directory
# for logs and outputs), steps; and uses: sock_dir (the daemon's socket is
# $sock_dir/s.sock), status (0 until something failed).
#   start_stratad PREFIX DAEMON-ARGS...   starts it (socket in a short /tmp
#       path: sun_path holds 108 bytes; NVMe files under $work/nvme, a real
#       file system that takes O_DIRECT) and waits until it is ready
#   run_example NAME EXAMPLE-ARGS...      runs the example with --ranks 2
#       --steps $steps into $work/NAME.out/.err and checks its step lines
#   finish PASS-MESSAGE                   prints the daemon's log on failure;
#       exits with the verdict

status=0
daemon_pid=
sock_dir=

cleanup() {
  if [ -n "$daemon_pid" ]; then kill -TERM "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null; fi
  # Keep the logs and outputs for a look after a failure, not the NVMe files.
  [ -n "$sock_dir" ] && rm -rf "$sock_dir"
  rm -rf "$work/nvme"
}

start_stratad() {  # start_stratad PREFIX DAEMON-ARGS...
  local prefix=$1; shift
  sock_dir=$(mktemp -d "/tmp/$prefix.XXXXXX")
  rm -rf "$work"
  mkdir -p "$work/nvme"
  trap cleanup EXIT
  "$stratad" --socket "$sock_dir/s.sock" --nvme_path "$work/nvme" "$@" >"$work/stratad.log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 1 100); do grep -q "stratad ready" "$work/stratad.log" && break; sleep 0.1; done
  grep -q "stratad ready" "$work/stratad.log" || {
    echo "FAIL: stratad did not become ready"; cat "$work/stratad.log"; exit 1; }
}

run_example() {  # run_example NAME EXAMPLE-ARGS...
  local name=$1; shift
  if ! timeout 300 "$example" --ranks 2 --steps "$steps" "$@" >"$work/$name.out" 2>"$work/$name.err"; then
    echo "FAIL: $name exited non-zero"; cat "$work/$name.err"; status=1
  fi
  echo "--- $name"; cat "$work/$name.out"
  local lines
  lines=$(grep -cE '^step [0-9]+ loss [0-9.eE+-]+$' "$work/$name.out")
  if [ "$lines" -ne "$steps" ]; then
    echo "FAIL: $name printed $lines well-formed step lines, expected $steps"; status=1
  fi
}

finish() {  # finish PASS-MESSAGE
  if [ "$status" -ne 0 ]; then echo "--- stratad log"; tail -50 "$work/stratad.log"; exit 1; fi
  echo "PASS: $1"
}
