# Sourced by scripts/ci_hardening.sh and scripts/tsan.sh: runs a sanitizer
# build's test binaries, one binary per process slot (each binary's own gtest
# cases run in order), with each binary's output in its own log.
#   run_test_binaries SOURCE_DIR BINARY_DIR LOG_DIR JOBS TAIL_LINES TEST...
# Extra arguments per binary come from the caller's associative array
# `test_args`, when it has one. Prints "<test>: ok (N s)" or "<test>: FAILED
# (exit C) (N s)" per binary, and a failed binary's last TAIL_LINES log lines
# before its line; returns 1 when any binary failed.
run_test_binaries() {
  local src="$1" bin="$2" logs="$3" jobs="$4" tail_lines="$5"
  shift 5
  local t failed=0
  for t in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    (
      t0=$(date +%s) rc=0 extra=""
      if declare -p test_args >/dev/null 2>&1; then extra="${test_args[$t]:-}"; fi
      STRATA_SOURCE_DIR="$src" STRATA_BINARY_DIR="$bin" "$bin/tests/$t" $extra >"$logs/$t.log" 2>&1 || rc=$?
      echo "$t: $([ $rc = 0 ] && echo ok || echo "FAILED (exit $rc)") ($(( $(date +%s) - t0 )) s)"
    ) > "$logs/$t.result" &
  done
  wait
  for t in "$@"; do
    if ! grep -q "^$t: ok" "$logs/$t.result"; then
      failed=1
      echo "--- $t (last $tail_lines lines of $logs/$t.log)"
      tail -n "$tail_lines" "$logs/$t.log"
    fi
    cat "$logs/$t.result"
  done
  return "$failed"
}
