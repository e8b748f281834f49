#!/usr/bin/env bash
# ThreadSanitizer build of strata's concurrent unit tests and of the
# end-to-end tests against a real stratad (issue 11; CI runs it from
# scripts/ci_hardening.sh). Everything lands in build-tsan/:
#   1. absl-lib/: Abseil built with -fsanitize=thread from Debian's own source
#      package of the installed libabsl (`apt-get source abseil=<version>`,
#      which needs a deb-src entry: added once, as root, next to Debian's).
#      Every lock here is an absl::Mutex, and Debian's libabsl is not
#      instrumented: TSan would see none of them and report every guarded
#      field as a race. The shared libraries keep Debian's SONAMEs, so one
#      absl serves strata's code and Debian's gRPC/protobuf alike: the test
#      binaries and stratad carry a DT_RPATH (which, unlike DT_RUNPATH, holds
#      for the libraries' own dependencies too) to absl-lib/, and step 3
#      checks with ldd that no libabsl is loaded from anywhere else.
#      strata itself compiles against Debian's absl headers (the same files).
#      One upstream fix is applied first, scripts/tsan_absl_mutex.patch:
#      without it absl::Mutex itself trips TSan (its header says why).
#   2. strata/: clang, -fsanitize=thread -O1, only the targets run below.
#   3. the tests, one binary per process slot. Every process (the forked
#      stratad too) writes its reports to build-tsan/logs/report.<pid>; any
#      report fails the run, as does a failing test. gRPC stays
#      uninstrumented; what TSan reports from inside it is suppressed in
#      scripts/tsan.supp (and each entry says why), nothing of strata's.
#   scripts/tsan.sh [all|build|tests]     (STRATA_JOBS, default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
. "$root/scripts/run_test_binaries.sh"
mode="${1:-all}"
jobs="${STRATA_JOBS:-2}"
out="$root/build-tsan"
case "$mode" in all|build|tests) ;; *) echo "usage: scripts/tsan.sh [all|build|tests]" >&2; exit 2 ;; esac
mkdir -p "$out"
flags="-fsanitize=thread -fno-omit-frame-pointer -O1 -gline-tables-only"
lib="$out/absl-lib"

# The concurrent parts: the daemon (job workers, doorbell, registry), the
# tiered store and its concurrency test, the prefetch scheduler, the I/O
# engines and extent store, the optimizer's thread pool, the client's slot
# copies, and the end-to-end tests that fork a real (instrumented) stratad
# (RPCs and the doorbell, restarts and kill -9, groups, partitions, several
# daemons, 200 jobs on the bounded worker pool).
tests=(daemon_test daemon_job_workers_test daemon_doorbell_test tiers_test prefetch_test swap_test
       optimizer_cpu_test client_slot_copy_test daemon_e2e_test daemon_threads_test daemon_durability_test
       daemon_groups_test daemon_partition_test daemon_multinode_test daemon_param_store_test daemon_window_test
       daemon_pipeline_test daemon_job_tiers_test daemon_window_e2e_test daemon_device_e2e_test
       client_doorbell_test daemon_job_device_tier_test daemon_job_early_step_test)
declare -A test_args=(
  # mlock is a no-op under TSan as under ASan (the sanitizers' interceptor
  # returns 0), so a lock beyond RLIMIT_MEMLOCK cannot fail in this build.
  [tiers_test]="--gtest_filter=-PinnedHostTierDeathTest.RequiredLockBeyondTheLimitNamesTheLimitAndTheFix"
)
step_start=0
begin() { step_start=$(date +%s); echo "=== tsan: $1"; }
took() { echo "=== tsan: $1 took $(( $(date +%s) - step_start )) s"; }

# ---- 1. Abseil with -fsanitize=thread, Debian's version and patches --------
absl_pkg=$(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 'libabsl2*' 2>/dev/null | awk '$1 == "ii" {print $2; exit}')
if [ -z "$absl_pkg" ]; then
  echo "tsan.sh: no libabsl runtime package installed (run scripts/install_deps.sh)" >&2; exit 1
fi
absl_version=$(dpkg-query -W -f='${source:Version}' "$absl_pkg")
patch_file="$root/scripts/tsan_absl_mutex.patch"
stamp="$absl_version $flags $(sha256sum "$patch_file" | cut -c1-16)"
if [ "$mode" != tests ] && [ "$(cat "$lib/.stamp" 2>/dev/null)" != "$stamp" ]; then
  begin "Abseil $absl_version (Debian source package) with -fsanitize=thread"
  if ! apt-get source --print-uris "abseil=$absl_version" >/dev/null 2>&1; then
    # No deb-src entry (Debian's default): add one for the same archives as
    # the binary packages, once, and fetch the source indexes.
    if [ "$(id -u)" -ne 0 ]; then
      echo "tsan.sh: apt has no deb-src entry for abseil $absl_version; run as root once to add it" >&2; exit 1
    fi
    srcs=/etc/apt/sources.list.d/strata-deb-src
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
      sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$srcs.sources"
    elif grep -qs '^deb ' /etc/apt/sources.list; then
      sed -n 's/^deb /deb-src /p' /etc/apt/sources.list > "$srcs.list"
    else
      echo "tsan.sh: found neither /etc/apt/sources.list.d/debian.sources nor deb lines in /etc/apt/sources.list" >&2; exit 1
    fi
    apt-get update -q -o DPkg::Lock::Timeout=300 >/dev/null
  fi
  rm -rf "$out/absl-src" "$out/absl-build" "$lib"
  mkdir -p "$out/absl-src"
  # apt checks the files against the signed Sources index; dpkg-source
  # applies Debian's patches (among them options.h's inline namespace).
  (cd "$out/absl-src" && apt-get source --download-only -q "abseil=$absl_version" >/dev/null 2>&1 &&
   dpkg-source -q -x ./*.dsc src >/dev/null 2>&1)
  patch -s -d "$out/absl-src/src" -p1 < "$patch_file"
  # debian/rules' shared build: C++17, shared libraries; plus TSan.
  cmake -S "$out/absl-src/src" -B "$out/absl-build" -G Ninja -DCMAKE_BUILD_TYPE=None \
        -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
        -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" -Wno-dev >/dev/null
  cmake --build "$out/absl-build" -j "$jobs" >/dev/null
  mkdir -p "$lib"
  find "$out/absl-build" -name 'libabsl_*.so.*' -exec cp -P {} "$lib/" \;
  # Same set of SONAMEs as the installed package, or some library would
  # still come from /usr/lib.
  if ! diff <(ls "$lib" | sort) <(dpkg -L "$absl_pkg" | sed -n 's|.*/\(libabsl_[^/]*\.so\.[^/]*\)$|\1|p' | sort); then
    echo "tsan.sh: the libraries built differ from $absl_pkg's (above)" >&2; exit 1
  fi
  echo "$stamp" > "$lib/.stamp"
  rm -rf "$out/absl-src" "$out/absl-build"
  took "Abseil"
fi

# ---- 2. strata with -fsanitize=thread ---------------------------------------
if [ "$mode" != tests ]; then
  begin "configure and build (clang, -fsanitize=thread): ${tests[*]}, stratad"
  cmake -S . -B "$out/strata" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
        -DCMAKE_C_FLAGS_DEBUG="$flags" -DCMAKE_CXX_FLAGS_DEBUG="$flags" \
        -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DSTRATA_WERROR=ON \
        -DSTRATA_BUILD_BENCH=OFF -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_PYTHON= \
        -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread -Wl,--disable-new-dtags -Wl,-rpath,$lib" >/dev/null
  cmake --build "$out/strata" -j "$jobs" --target "${tests[@]}" stratad strata-test-rank
  took "build"
fi

# ---- 3. the tests -------------------------------------------------------------
if [ "$mode" = tests ] || [ "$mode" = all ]; then
  begin "tests under TSan"
  bin="$out/strata"
  # One absl in every process: each libabsl from absl-lib/, none from /usr.
  for b in "${tests[@]/#/tests/}" bin/stratad tests/strata-test-rank; do
    stray=$(ldd "$bin/$b" | awk '/libabsl_/ && $3 !~ "^'"$lib"'/" {print $1 " => " $3}')
    if [ -n "$stray" ]; then
      echo "tsan.sh: $b loads an uninstrumented absl:"$'\n'"$stray" >&2; exit 1
    fi
  done
  logs="$out/logs"
  rm -rf "$logs" && mkdir -p "$logs"
  # Every process writes its reports to $logs/report.<pid>: stratad and the
  # rank processes, forked by the e2e tests, inherit these options, and a
  # report there (even one while stopping, which no test sees) fails the run.
  export TSAN_OPTIONS="halt_on_error=1:exitcode=66:second_deadlock_stack=1:log_path=$logs/report:suppressions=$root/scripts/tsan.supp"
  failed=0
  run_test_binaries "$root" "$bin" "$logs" "$jobs" 100 "${tests[@]}" || failed=1
  for r in "$logs"/report.*; do
    [ -e "$r" ] || continue
    failed=1
    echo "--- TSan report $r"
    head -n 300 "$r"
  done
  took "tests"
  exit "$failed"
fi
