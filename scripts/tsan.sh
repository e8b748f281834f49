#!/usr/bin/env bash
# ThreadSanitizer build of strata's C++ unit and end-to-end tests (issue 11).
# TSan must see every mutex: Debian's libabsl is not instrumented, so this
# first builds Abseil from Debian's own source package (`apt-get source
# abseil`, which needs a deb-src line) with -fsanitize=thread into
# build-tsan/absl, then strata against it in build-tsan/strata, then runs
# ctest there. gRPC and protobuf stay uninstrumented; their internal races
# are suppressed by library in build-tsan/tsan.supp.
#   scripts/tsan.sh            (STRATA_JOBS, default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
jobs="${STRATA_JOBS:-2}"
out="$root/build-tsan"
mkdir -p "$out"
start=$(date +%s)
flags="-fsanitize=thread -fno-omit-frame-pointer -g -O1"

if [ ! -f "$out/absl/.done" ]; then
  rm -rf "$out/absl-src" && mkdir -p "$out/absl-src"
  (cd "$out/absl-src" && apt-get source --download-only abseil >/dev/null && dpkg-source -x ./*.dsc src >/dev/null)
  # The same version and options Debian builds libabsl with, plus TSan.
  cmake -S "$out/absl-src/src" -B "$out/absl-build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_CXX_STANDARD=17 -DABSL_PROPAGATE_CXX_STD=ON -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
        -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_INSTALL_PREFIX="$out/absl"
  cmake --build "$out/absl-build" -j "$jobs"
  cmake --install "$out/absl-build" >/dev/null
  touch "$out/absl/.done"
fi

cat > "$out/tsan.supp" <<'SUPP'
called_from_lib:libgrpc.so
called_from_lib:libgrpc++.so
called_from_lib:libprotobuf.so
SUPP

cmake -S . -B "$out/strata" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_WERROR=ON \
      -DSTRATA_BUILD_BENCH=OFF -DSTRATA_ENABLE_CUDA=OFF -DSTRATA_PYTHON= \
      -DCMAKE_PREFIX_PATH="$out/absl" -Dabsl_DIR="$out/absl/lib/cmake/absl" \
      -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
      -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread -Wl,-rpath,$out/absl/lib"
cmake --build "$out/strata" -j "$jobs"
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$out/tsan.supp" \
  ctest --test-dir "$out/strata" --output-on-failure --timeout 1800 -j "$jobs"
echo "tsan.sh: took $(( $(date +%s) - start )) s"
