#!/usr/bin/env bash
# CI's hardening step (issue 11): fuzzing and sanitizers in a bounded time,
# after scripts/install_deps.sh. One clang tree, build-hardening/, serves all
# of it: with -DSTRATA_FUZZ=ON every object is built with
# -fsanitize=fuzzer-no-link,address,undefined and clang's -Wthread-safety
# -Werror, so
#   1. building it is the thread-safety check of everything it compiles
#      (the ABSL_GUARDED_BY annotations), and the remaining translation units
#      are checked with -fsyntax-only (no code generated);
#   2. the unit tests of core/, swap/, tiers/, daemon/ and the daemon's
#      end-to-end test run under ASan+UBSan (stratad, forked by the e2e test,
#      is the instrumented one);
#   3. each libFuzzer target replays its committed corpus, then fuzzes with a
#      fixed seed for a fixed number of inputs (fuzz_runs below; at most 60 s
#      each): CI explores the same inputs on every machine, so what passed
#      here cannot fail there by luck, and a change that breaks a parser
#      still meets the same thousands of mutated records. Finding new bugs is
#      the long mode's job: STRATA_FUZZ_SECONDS=N fuzzes N seconds per target
#      with a random seed.
# Any warning, sanitizer report, failing test or fuzzer crash fails the run
# (exit 1); the crashing input is left in build-hardening/fuzz-artifacts/.
#   4. ThreadSanitizer (scripts/tsan.sh, its own tree build-tsan/): Abseil
#      rebuilt with -fsanitize=thread from Debian's source package, then the
#      concurrent unit tests and the e2e tests against a real stratad. Any
#      report fails the step. STRATA_SKIP_TSAN=1 skips it (local runs
#      only; CI runs it).
#   scripts/ci_hardening.sh                 (STRATA_JOBS, default 2)
#   STRATA_FUZZ_SECONDS=600 scripts/ci_hardening.sh fuzz   # a long fuzzing run
# Modes: all (default), build, tsa, tests, fuzz (each after `build`), tsan.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
. "$root/scripts/run_test_binaries.sh"
mode="${1:-all}"
jobs="${STRATA_JOBS:-2}"
fuzz_seconds="${STRATA_FUZZ_SECONDS:-}"
out="$root/build-hardening"
case "$mode" in all|build|tsa|tests|fuzz|tsan) ;; *) echo "usage: scripts/ci_hardening.sh [all|build|tsa|tests|fuzz|tsan]" >&2; exit 2 ;; esac

fuzzers=(deepspeed_config_fuzz daemon_config_fuzz job_record_fuzz service_rpc_fuzz)
unit_tests=(core_test swap_test tiers_test daemon_config_test daemon_test job_settings_test daemon_job_workers_test
            daemon_doorbell_test daemon_e2e_test daemon_job_restore_test daemon_pipeline_test daemon_window_test
            daemon_param_store_test daemon_job_tiers_test daemon_job_device_tier_test daemon_job_early_step_test
            client_doorbell_test)
# mlock is a no-op under ASan (its interceptor returns 0), so the test that
# a lock beyond RLIMIT_MEMLOCK fails cannot pass in this build.
declare -A test_args=(
  [tiers_test]="--gtest_filter=-PinnedHostTierDeathTest.RequiredLockBeyondTheLimitNamesTheLimitAndTheFix"
)
# Inputs per target in CI's fixed-seed run: about 20 s each on a 2-core EPYC.
declare -A fuzz_runs=(
  [deepspeed_config_fuzz]=100000
  [daemon_config_fuzz]=40000
  [job_record_fuzz]=10000
  [service_rpc_fuzz]=2000
)
declare -A corpus=(
  [deepspeed_config_fuzz]=core/fuzz/corpus/deepspeed_config
  [daemon_config_fuzz]=daemon/fuzz/corpus/daemon_config
  [job_record_fuzz]=daemon/fuzz/corpus/job_record
  [service_rpc_fuzz]=daemon/fuzz/corpus/service_rpc
)
summary=()
failed=0
step_start=0
begin() { step_start=$(date +%s); echo "=== ci_hardening: $1"; }
record() { summary+=("$(printf '%-44s %5d s  %s' "$1" $(( $(date +%s) - step_start )) "$2")"); }

export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp"

if [ "$mode" = all ] || [ "$mode" = build ]; then
  begin "configure and build (clang, ASan+UBSan+coverage, -Wthread-safety -Werror)"
  # -O1 and line tables only: the build is most of this step's time, and
  # sanitizer reports still name file and line.
  cmake -S . -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
        -DCMAKE_C_FLAGS_DEBUG="-O1 -gline-tables-only" -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" \
        -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSTRATA_FUZZ=ON -DSTRATA_WERROR=ON \
        -DSTRATA_BUILD_BENCH=ON -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_PYTHON= >/dev/null
  cmake --build "$out" -j "$jobs" --target "${fuzzers[@]}" "${unit_tests[@]}" stratad strata-test-rank
  record "build (${#fuzzers[@]} fuzzers, ${#unit_tests[@]} tests)" ok
fi

if [ "$mode" = all ] || [ "$mode" = tsa ]; then
  begin "thread-safety analysis of the translation units not built above (-fsyntax-only)"
  # compile_commands.json holds clang's command for every source; those
  # whose object exists were checked by the build itself. Generated protobuf
  # headers exist once the build above ran.
  cmake --build "$out" -j "$jobs" --target strata_proto >/dev/null
  status=ok
  if ! python3 - "$out" "$jobs" <<'PY'
import json, os, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
out, jobs = sys.argv[1], int(sys.argv[2])
todo = []
for e in json.load(open(os.path.join(out, "compile_commands.json"))):
    args = shlex.split(e["command"])
    obj = args[args.index("-o") + 1]
    if os.path.exists(os.path.join(e["directory"], obj)) or "/_deps/" in e["file"]:
        continue
    # Drop the launcher and the output; keep flags (with -Wthread-safety -Werror).
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    i = args.index("-o"); del args[i:i + 2]
    todo.append((e["directory"], args + ["-fsyntax-only"], e["file"]))
def check(item):
    d, args, f = item
    r = subprocess.run(args, cwd=d, capture_output=True, text=True)
    return f, r.returncode, r.stderr
bad = 0
with ThreadPoolExecutor(jobs) as pool:
    for f, rc, err in pool.map(check, todo):
        if rc != 0:
            bad += 1
            print(f"--- {f}\n{err}", file=sys.stderr)
print(f"tsa: {len(todo)} more translation units checked, {bad} failed")
sys.exit(1 if bad else 0)
PY
  then
    status=FAILED
    failed=1
  fi
  record "thread-safety -fsyntax-only (the rest)" "$status"
fi

if [ "$mode" = all ] || [ "$mode" = tests ]; then
  begin "unit and e2e tests under ASan+UBSan"
  logs="$out/hardening-logs"
  rm -rf "$logs" && mkdir -p "$logs"
  # A report aborts the binary (abort_on_error), failing it.
  status=ok
  if ! run_test_binaries "$root" "$out" "$logs" "$jobs" 120 "${unit_tests[@]}"; then
    status=FAILED
    failed=1
  fi
  record "asan+ubsan tests (${unit_tests[*]})" "$status"
fi

if [ "$mode" = all ] || [ "$mode" = fuzz ]; then
  mkdir -p "$out/fuzz-artifacts"
  for f in "${fuzzers[@]}"; do
    if [ -n "$fuzz_seconds" ]; then
      bound=(-max_total_time="$fuzz_seconds")
      begin "fuzz $f for ${fuzz_seconds} s, random seed"
    else
      rm -rf "$out/fuzz-work/$f"  # the same start on every machine
      bound=(-seed=1 -runs="${fuzz_runs[$f]}" -max_total_time=60)
      begin "fuzz $f: ${fuzz_runs[$f]} inputs, seed 1"
    fi
    work="$out/fuzz-work/$f"
    mkdir -p "$work"
    # New inputs go to $work (the build tree); the committed seeds are read only.
    status=ok
    if ! "$out/bin/$f" "${bound[@]}" -timeout=10 -rss_limit_mb=3072 -max_len=8192 \
         -print_final_stats=1 -artifact_prefix="$out/fuzz-artifacts/$f-" "$work" "${corpus[$f]}" \
         >"$out/fuzz-artifacts/$f.log" 2>&1; then
      status=FAILED
      failed=1
      tail -n 80 "$out/fuzz-artifacts/$f.log"
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/fuzz-artifacts/$f.log" | tail -n 1)
    record "fuzz $f" "$status, ${runs:-?} executions"
  done
fi

if [ "$mode" = all ] || [ "$mode" = tsan ]; then
  if [ "${STRATA_SKIP_TSAN:-0}" = 1 ]; then
    summary+=("$(printf '%-44s %5s    %s' "tsan" "-" "skipped (STRATA_SKIP_TSAN=1)")")
  else
    begin "ThreadSanitizer: Abseil, build, unit and e2e tests (scripts/tsan.sh)"
    status=ok
    if ! bash scripts/tsan.sh; then
      status=FAILED
      failed=1
    fi
    record "tsan (Abseil + build + tests, build-tsan/)" "$status"
  fi
fi

echo "=== ci_hardening summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
