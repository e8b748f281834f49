#!/usr/bin/env bash
# Sanitizer builds of strata's C++ (issue 11):
#   asan  ASan + UBSan build in build-asan/, then the unit and end-to-end tests
#         (ctest; the Python/torch tests are left out: they load torch's own
#         uninstrumented libraries). Any report fails the run.
#   tsa   clang build in build-tsa/ with -Wthread-safety -Werror (the
#         ABSL_GUARDED_BY annotations checked at compile time; no tests run).
#   all   both (the default).
#   scripts/sanitize.sh [asan|tsa|all]
# Environment: STRATA_JOBS (default 2) for both build and ctest parallelism.
# TSan needs Abseil itself built with -fsanitize=thread: see scripts/tsan.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-all}"
jobs="${STRATA_JOBS:-2}"
case "$mode" in asan|tsa|all) ;; *) echo "usage: scripts/sanitize.sh [asan|tsa|all]" >&2; exit 2 ;; esac

if [ "$mode" = asan ] || [ "$mode" = all ]; then
  start=$(date +%s)
  flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_WERROR=ON \
        -DSTRATA_BUILD_BENCH=OFF -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_PYTHON= \
        -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
        -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
        -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined"
  cmake --build build-asan -j "$jobs"
  # Leaks are reported (and fail) as well; stratad forked by the e2e tests
  # inherits the options and writes its reports to its log, which the test
  # prints on failure.
  ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    ctest --test-dir build-asan --output-on-failure --timeout 900 -j "$jobs"
  echo "sanitize.sh: asan+ubsan build and tests took $(( $(date +%s) - start )) s"
fi

if [ "$mode" = tsa ] || [ "$mode" = all ]; then
  start=$(date +%s)
  # StrataHelpers.cmake adds -Wthread-safety for clang; STRATA_WERROR makes it fatal.
  cmake -S . -B build-tsa -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSTRATA_WERROR=ON \
        -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
        -DSTRATA_BUILD_TESTS=OFF -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_PYTHON=
  cmake --build build-tsa -j "$jobs"
  echo "sanitize.sh: clang -Wthread-safety -Werror build took $(( $(date +%s) - start )) s"
fi
